/* MemCache's use of libmf_smem.so, reproduced: it dlopen()s the library and calls only these
 * functions (smem_bm_api.cpp of Ascend/memcache). One rank per process:
 *
 *   memcache_bm tcp://127.0.0.1:PORT WORLD RANK
 *
 * Rank 0 serves the store. Every rank writes into the next rank's slice (H2G, and a batch),
 * reads the next rank's slice back (G2H) and copies it into its own (G2G), checks what the previous rank wrote into its own slice
 * by dereferencing its local global address, and exits 0 printing "OK <rank>". */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "smem/host/smem_bm.h"

#define MIB (1ULL << 20)
#define SLICE (32 * MIB)

static struct {
    int32_t (*init)(uint32_t);
    void (*uninit)(void);
    int32_t (*set_log_level)(int);
    int32_t (*set_extern_logger)(void (*)(int, const char *));
    const char *(*get_and_clear_last_err_msg)(void);
    int32_t (*config_init)(smem_bm_config_t *);
    int32_t (*bm_init)(const char *, uint32_t, uint16_t, const smem_bm_config_t *);
    void (*bm_uninit)(uint32_t);
    smem_bm_t (*create2)(uint32_t, const smem_bm_create_option_t *);
    void (*destroy)(smem_bm_t);
    int32_t (*join)(smem_bm_t, uint32_t);
    uint32_t (*get_rank_id)(void);
    void *(*ptr_by_mem_type)(smem_bm_t, smem_bm_mem_type, uint16_t);
    uint64_t (*local_mem_size)(smem_bm_t, smem_bm_mem_type);
    int32_t (*register_user_mem)(smem_bm_t, uint64_t, uint64_t);
    int32_t (*unregister_user_mem)(smem_bm_t, uint64_t);
    int32_t (*copy)(smem_bm_t, smem_copy_params *, smem_bm_copy_type, uint32_t);
    int32_t (*copy_batch)(smem_bm_t, smem_batch_copy_params *, smem_bm_copy_type, uint32_t);
    int32_t (*wait)(smem_bm_t);
} api;

static int rank;

static void fail(const char *what, int rc) {
    printf("FAIL rank %d: %s: rc %d: %s\n", rank, what, rc, api.get_and_clear_last_err_msg());
    exit(1);
}

static void logger(int level, const char *msg) {
    if (level >= 3) fprintf(stderr, "smem[%d] rank %d: %s\n", level, rank, msg);
}

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        printf("FAIL rank %d: dlsym %s: %s\n", rank, name, dlerror());
        exit(1);
    }
    return p;
}

static uint8_t pat(int r, size_t i) { return (uint8_t)(r * 37 + i * 11 + (i >> 10)); }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* copy retries while the peer has not joined yet (a copy to a non-member fails), up to 30 s. */
static void copy_retry(smem_bm_t h, const void *src, void *dst, size_t n, smem_bm_copy_type t, const char *what) {
    smem_copy_params p = {src, dst, n};
    double end = now() + 30;
    int rc;
    while ((rc = api.copy(h, &p, t, 0)) != SM_OK) {
        if (now() > end) fail(what, rc);
        api.get_and_clear_last_err_msg();
        usleep(10000);
    }
}

/* wait_bytes polls local memory until it equals want, up to 30 s. */
static void wait_bytes(const volatile uint8_t *p, const uint8_t *want, size_t n, const char *what) {
    double end = now() + 30;
    while (memcmp((const void *)p, want, n) != 0) {
        if (now() > end) {
            printf("FAIL rank %d: %s never arrived\n", rank, what);
            exit(1);
        }
        usleep(1000);
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s STORE_URL WORLD RANK\n", argv[0]);
        return 2;
    }
    const char *url = argv[1];
    int world = atoi(argv[2]);
    rank = atoi(argv[3]);
    const char *path = getenv("MF_SMEM_LIB") ? getenv("MF_SMEM_LIB") : "libmf_smem.so";
    void *lib = dlopen(path, RTLD_NOW);
    if (!lib) {
        printf("FAIL rank %d: dlopen %s: %s\n", rank, path, dlerror());
        return 1;
    }
    *(void **)&api.init = sym(lib, "smem_init");
    *(void **)&api.uninit = sym(lib, "smem_uninit");
    *(void **)&api.set_log_level = sym(lib, "smem_set_log_level");
    *(void **)&api.set_extern_logger = sym(lib, "smem_set_extern_logger");
    *(void **)&api.get_and_clear_last_err_msg = sym(lib, "smem_get_and_clear_last_err_msg");
    *(void **)&api.config_init = sym(lib, "smem_bm_config_init");
    *(void **)&api.bm_init = sym(lib, "smem_bm_init");
    *(void **)&api.bm_uninit = sym(lib, "smem_bm_uninit");
    *(void **)&api.create2 = sym(lib, "smem_bm_create2");
    *(void **)&api.destroy = sym(lib, "smem_bm_destroy");
    *(void **)&api.join = sym(lib, "smem_bm_join");
    *(void **)&api.get_rank_id = sym(lib, "smem_bm_get_rank_id");
    *(void **)&api.ptr_by_mem_type = sym(lib, "smem_bm_ptr_by_mem_type");
    *(void **)&api.local_mem_size = sym(lib, "smem_bm_get_local_mem_size_by_mem_type");
    *(void **)&api.register_user_mem = sym(lib, "smem_bm_register_user_mem");
    *(void **)&api.unregister_user_mem = sym(lib, "smem_bm_unregister_user_mem");
    *(void **)&api.copy = sym(lib, "smem_bm_copy");
    *(void **)&api.copy_batch = sym(lib, "smem_bm_copy_batch");
    *(void **)&api.wait = sym(lib, "smem_bm_wait");

    int rc;
    if ((rc = api.init(0)) != SM_OK) fail("smem_init", rc);
    if ((rc = api.set_log_level(2)) != SM_OK) fail("smem_set_log_level", rc);
    if ((rc = api.set_extern_logger(logger)) != SM_OK) fail("smem_set_extern_logger", rc);
    if (api.set_extern_logger(NULL) != SM_INVALID_PARAM) fail("smem_set_extern_logger(NULL)", -1);
    api.get_and_clear_last_err_msg();

    smem_bm_config_t cfg;
    if ((rc = api.config_init(&cfg)) != SM_OK) fail("smem_bm_config_init", rc);
    if (!cfg.autoRanking || !cfg.startConfigStoreServer || cfg.controlOperationTimeout != 120) fail("config defaults", -1);
    cfg.autoRanking = false;
    cfg.rankId = (uint16_t)rank;
    cfg.startConfigStoreServer = rank == 0;
    if ((rc = api.bm_init(url, (uint32_t)world, 0, &cfg)) != SM_OK) fail("smem_bm_init", rc);
    if (api.get_rank_id() != (uint32_t)rank) fail("smem_bm_get_rank_id", (int)api.get_rank_id());

    smem_bm_create_option_t opt;
    memset(&opt, 0, sizeof opt);
    opt.maxDramSize = opt.localDRAMSize = SLICE;
    opt.dataOpType = SMEMB_DATA_OP_HOST_TCP;
    opt.dramShmFd = -1;
    smem_bm_t h = api.create2(1, &opt);
    if (!h) fail("smem_bm_create2", -1);
    if (api.create2(1, &opt) != NULL) fail("smem_bm_create2 of an existing id", -1);
    api.get_and_clear_last_err_msg();
    if (api.local_mem_size(h, SMEM_MEM_TYPE_HOST) != SLICE) fail("local mem size", -1);

    /* The local slice is memory at its global address: fill it before joining. */
    uint8_t *mine = api.ptr_by_mem_type(h, SMEM_MEM_TYPE_HOST, (uint16_t)rank);
    for (size_t i = 0; i < 64 * 1024; i++) mine[i] = pat(rank, i);
    if ((rc = api.join(h, 0)) != SM_OK) fail("smem_bm_join", rc);

    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    uint8_t *theirs = api.ptr_by_mem_type(h, SMEM_MEM_TYPE_HOST, (uint16_t)next);
    size_t n = 64 * 1024;
    uint8_t *buf = malloc(MIB), *back = malloc(n), *want = malloc(n);
    for (size_t i = 0; i < MIB; i++) buf[i] = pat(rank + 100, i);
    if ((rc = api.register_user_mem(h, (uint64_t)(uintptr_t)buf, MIB)) != SM_OK) fail("register_user_mem", rc);

    /* H2G into the next rank's slice, G2H of its pattern. */
    copy_retry(h, buf, theirs + MIB + (size_t)rank * n, n, SMEMB_COPY_H2G, "H2G");
    copy_retry(h, theirs, back, n, SMEMB_COPY_G2H, "G2H");
    for (size_t i = 0; i < n; i++)
        if (back[i] != pat(next, i)) fail("G2H bytes", (int)i);
    /* G2G: the next rank's pattern into this rank's own slice, checked through the local GVA. */
    copy_retry(h, theirs, mine + 3 * MIB, n, SMEMB_COPY_G2G, "G2G");
    for (size_t i = 0; i < n; i++)
        if (mine[3 * MIB + i] != pat(next, i)) fail("G2G bytes", (int)i);
    /* A batch of four 4 KiB pieces (async, then wait). */
    void *srcs[4], *dsts[4];
    uint64_t sizes[4];
    for (int i = 0; i < 4; i++) {
        srcs[i] = buf + 8192 * i;
        dsts[i] = theirs + 2 * MIB + (size_t)rank * 16384 + 4096 * i;
        sizes[i] = 4096;
    }
    smem_batch_copy_params bp = {srcs, dsts, sizes, 4};
    if ((rc = api.copy_batch(h, &bp, SMEMB_COPY_H2G, ASYNC_COPY_FLAG)) != SM_OK) fail("copy_batch", rc);
    if ((rc = api.wait(h)) != SM_OK) fail("smem_bm_wait", rc);
    /* Bad input is refused with SM_INVALID_PARAM. */
    smem_copy_params bad = {buf, theirs + SLICE - 8, 16};
    if (api.copy(h, &bad, SMEMB_COPY_H2G, 0) != SM_INVALID_PARAM) fail("copy past the slice", -1);
    api.get_and_clear_last_err_msg();

    /* What the previous rank wrote into this slice, read through the local global address. */
    for (size_t i = 0; i < n; i++) want[i] = pat(prev + 100, i);
    wait_bytes(mine + MIB + (size_t)prev * n, want, n, "H2G from the previous rank");
    for (int i = 0; i < 4; i++)
        wait_bytes(mine + 2 * MIB + (size_t)prev * 16384 + 4096 * i, want + 8192 * i, 4096, "batch piece");

    /* Finish together: everyone tells rank 0; rank 0 tells everyone; rank 0 leaves last. */
    uint64_t one = 1;
    uint8_t *zero = api.ptr_by_mem_type(h, SMEM_MEM_TYPE_HOST, 0);
    copy_retry(h, &one, zero + 4 * MIB + 8 * (size_t)rank, 8, SMEMB_COPY_H2G, "done flag");
    if (rank == 0) {
        uint64_t ones[SMEM_WORLD_SIZE_MAX];
        for (int r = 0; r < world; r++) ones[r] = 1;
        wait_bytes(mine + 4 * MIB, (const uint8_t *)ones, 8 * (size_t)world, "every rank's done flag");
        for (int r = 1; r < world; r++) {
            uint8_t *p = api.ptr_by_mem_type(h, SMEM_MEM_TYPE_HOST, (uint16_t)r);
            copy_retry(h, &one, p + 5 * MIB, 8, SMEMB_COPY_H2G, "go flag");
        }
        /* Stay until every other rank has left (a copy to it then fails). */
        for (int r = 1; r < world; r++) {
            uint8_t *p = api.ptr_by_mem_type(h, SMEM_MEM_TYPE_HOST, (uint16_t)r);
            smem_copy_params probe = {&one, p + 6 * MIB, 8};
            double end = now() + 60;
            while (api.copy(h, &probe, SMEMB_COPY_H2G, 0) == SM_OK) {
                if (now() > end) fail("waiting for the others to leave", -1);
                usleep(5000);
            }
            api.get_and_clear_last_err_msg();
        }
    } else {
        wait_bytes(mine + 5 * MIB, (const uint8_t *)&one, 8, "rank 0's go flag");
    }
    if ((rc = api.unregister_user_mem(h, (uint64_t)(uintptr_t)buf)) != SM_OK) fail("unregister_user_mem", rc);
    api.destroy(h);
    api.bm_uninit(0);
    api.uninit();
    printf("OK %d\n", rank);
    return 0;
}
