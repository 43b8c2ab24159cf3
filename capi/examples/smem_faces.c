/* memfabric's Share Memory set-up and transfer engine through libmf_smem.so, two processes:
 *
 *   smem_faces tcp://127.0.0.1:PORT RANK TRANS_ID_0 TRANS_ID_1
 *
 * Both ranks create a symmetric heap (rank 0 serves the store), gather and sub-group-gather
 * bytes, allocate and release an atomic number, check reachability; then rank 0 (sender) writes
 * into rank 1's (receiver's) registered buffer with smem_trans_write and batch_write, reads it
 * back, and rank 1 checks the bytes in its own memory. Prints "OK <rank>". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "smem/host/smem_shm.h"
#include "smem/host/smem_trans.h"

static int rank;

static void fail(const char *what, long rc) {
    printf("FAIL rank %d: %s: %ld: %s\n", rank, what, rc, smem_get_and_clear_last_err_msg());
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 5) return 2;
    const char *url = argv[1];
    rank = atoi(argv[2]);
    const char *ids[2] = {argv[3], argv[4]};
    int rc;
    smem_shm_config_t sc;
    if ((rc = smem_shm_config_init(&sc)) != SM_OK) fail("shm config", rc);
    sc.startConfigStoreServer = rank == 0;
    if ((rc = smem_shm_init(url, 2, (uint32_t)rank, 0, &sc)) != SM_OK) fail("smem_shm_init", rc);
    void *gva = NULL;
    smem_shm_t h = smem_shm_create(0, 2, (uint32_t)rank, 2 << 20, SMEMS_DATA_OP_MTE, 0, &gva);
    if (!h || !gva) fail("smem_shm_create", 0);
    if (smem_shm_get_global_rank(h) != (uint32_t)rank || smem_shm_get_global_rank_size(h) != 2) fail("ranks", 0);
    if ((smem_shm_query_support_data_operation() & SMEMS_DATA_OP_MTE) == 0) fail("query", 0);
    uint32_t reach = 0;
    if ((rc = smem_shm_topology_can_reach(h, (uint32_t)(1 - rank), &reach)) != SM_OK || !(reach & SMEMS_DATA_OP_RDMA))
        fail("topology_can_reach", rc);
    /* Rank r's block is gva + r * size, and a co-located peer's is plain memory. */
    ((volatile uint8_t *)gva)[(size_t)rank * (2 << 20)] = (uint8_t)(40 + rank);
    if ((rc = smem_shm_control_barrier(h)) != SM_OK) fail("control_barrier", rc);
    if (((volatile uint8_t *)gva)[(size_t)(1 - rank) * (2 << 20)] != 40 + 1 - rank) fail("load from the peer's block", 0);
    char send[3] = {'a', (char)('0' + rank), 'z'}, recv[6];
    if ((rc = smem_shm_control_allgather(h, send, 3, recv, 6)) != SM_OK) fail("control_allgather", rc);
    if (memcmp(recv, "a0za1z", 6) != 0) fail("allgather bytes", 0);
    if (smem_shm_control_allgather(h, send, 3, recv, 5) != SM_INVALID_PARAM) fail("allgather size check", 0);
    smem_get_and_clear_last_err_msg();
    if ((rc = smem_shm_subgroup_barrier(h, "pair", 2, (uint32_t)(1 - rank))) != SM_OK) fail("subgroup_barrier", rc);
    if ((rc = smem_shm_subgroup_allgather(h, "pair", 2, (uint32_t)(1 - rank), send, 3, recv, 6)) != SM_OK)
        fail("subgroup_allgather", rc);
    if (memcmp(recv, "a1za0z", 6) != 0) fail("subgroup allgather order", 0);
    uint32_t num = 0;
    if ((rc = smem_shm_atomic_alloc_value(h, 1024, &num)) != SM_OK) fail("atomic_alloc_value", rc);
    if ((rc = smem_shm_atomic_release_value(h, (int32_t)num)) != SM_OK) fail("atomic_release_value", rc);
    if ((rc = smem_shm_set_extra_context(h, "ctx", 3)) != SM_OK) fail("set_extra_context", rc);

    /* The transfer engine: rank 0 sends, rank 1 receives. */
    smem_trans_config_t tc;
    if ((rc = smem_trans_config_init(&tc)) != SM_OK) fail("trans config", rc);
    tc.role = rank == 0 ? SMEM_TRANS_SENDER : SMEM_TRANS_RECEIVER;
    tc.dataOpType = SMEMB_DATA_OP_HOST_TCP;
    if ((rc = smem_trans_init(&tc)) != SM_OK) fail("smem_trans_init", rc);
    smem_trans_t t = smem_trans_create("P2PHANDSHAKE", ids[rank], &tc);
    if (!t) fail("smem_trans_create", 0);
    uint8_t *buf = smem_trans_malloc(t, 1 << 20);
    if (!buf) fail("smem_trans_malloc", 0);
    /* Tell the peer our buffer's address through the heap: the peer's block, word 8. */
    uint64_t mine = (uint64_t)(uintptr_t)buf;
    memcpy((uint8_t *)gva + (size_t)(1 - rank) * (2 << 20) + 8, &mine, 8);
    if ((rc = smem_shm_control_barrier(h)) != SM_OK) fail("barrier", rc);
    uint64_t theirs;
    memcpy(&theirs, (uint8_t *)gva + (size_t)rank * (2 << 20) + 8, 8);
    if (rank == 0) {
        uint8_t src[8192];
        for (int i = 0; i < 8192; i++) src[i] = (uint8_t)(i * 7);
        if ((rc = smem_trans_register_mem(t, src, sizeof src, 0)) != SM_OK) fail("register_mem", rc);
        if ((rc = smem_trans_write(t, src, ids[1], (void *)(uintptr_t)theirs, 4096, 0)) != SM_OK) fail("trans write", rc);
        const void *srcs[2] = {src + 4096, src + 6144};
        void *dsts[2] = {(void *)(uintptr_t)(theirs + 4096), (void *)(uintptr_t)(theirs + 6144)};
        size_t sizes[2] = {2048, 2048};
        if ((rc = smem_trans_batch_write(t, srcs, ids[1], dsts, sizes, 2, 0)) != SM_OK) fail("trans batch_write", rc);
        uint8_t back[8192];
        if ((rc = smem_trans_read(t, back, ids[1], (void *)(uintptr_t)theirs, 8192, 0)) != SM_OK) fail("trans read", rc);
        if (memcmp(back, src, 8192) != 0) fail("read back", 0);
        if (smem_trans_write(t, src, ids[1], (void *)(uintptr_t)(theirs + (2 << 20)), 8, 0) == SM_OK)
            fail("a write to unregistered memory succeeded", 0);
        smem_get_and_clear_last_err_msg();
        if ((rc = smem_trans_deregister_mem(t, src)) != SM_OK) fail("deregister_mem", rc);
    }
    if ((rc = smem_shm_control_barrier(h)) != SM_OK) fail("barrier", rc);
    if (rank == 1)
        for (int i = 0; i < 8192; i++)
            if (buf[i] != (uint8_t)(i * 7)) fail("received bytes", i);
    if ((rc = smem_shm_control_barrier(h)) != SM_OK) fail("barrier", rc);
    if ((rc = smem_trans_free(t, buf)) != SM_OK) fail("trans free", rc);
    smem_trans_destroy(t, 0);
    smem_trans_uninit(0);
    if ((rc = smem_shm_destroy(h, 0)) != SM_OK) fail("smem_shm_destroy", rc);
    smem_shm_uninit(0);
    printf("OK %d\n", rank);
    return 0;
}
