/* The KV-cache pool through libhmc.so's C face (hmc_kv_*), two processes, byte-checked.
 *   kv_pool lend        -> serves a master, lends 32 MiB, puts 32 objects each gathered from two
 *                          parts, prints "READY <master>", then waits for its stdin to close
 *   kv_pool use MASTER  -> a client lending nothing: checks the lender's objects (batch exist,
 *                          a batch get scattered over two parts each), puts its own into the
 *                          lender's segment and reads them back, and Mooncake's codes
 * Exit status 0 means every check passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hmc.h"

#define CHECK(call) do { int rc_ = (int)(call); if (rc_ != 0) { \
	fprintf(stderr, "%s:%d: %s = %d: %s\n", __FILE__, __LINE__, #call, rc_, hmc_last_error()); exit(1); } } while (0)
#define WANT(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: want %s (%s)\n", __FILE__, __LINE__, #cond, \
	hmc_last_error()); exit(1); } } while (0)

enum { COUNT = 32, SIZE = 20011 };

static unsigned char byte_of(size_t i, unsigned seed) { return (unsigned char)(i * 31 + seed + (i >> 9)); }

/* keys "<prefix><i>" for i < n, NUL-terminated one after another; returns their length. */
static size_t keys(char *out, const char *prefix, int n) {
	size_t len = 0;
	for (int i = 0; i < n; i++) len += (size_t)sprintf(out + len, "%s%d", prefix, i) + 1;
	return len;
}

static int lend(void) {
	char addr[64];
	uint64_t m, c;
	CHECK(hmc_kv_master_start("127.0.0.1:0", 0, 0, addr, sizeof addr, &m));
	CHECK(hmc_kv_client_create(addr, "127.0.0.1", NULL, "tcp", 32 << 20, &c));
	static unsigned char vals[COUNT][SIZE];
	static char ks[COUNT * 16];
	uint32_t counts[COUNT];
	uint64_t addrs[2 * COUNT], sizes[2 * COUNT];
	int32_t out[COUNT];
	for (int i = 0; i < COUNT; i++) {
		for (size_t j = 0; j < SIZE; j++) vals[i][j] = byte_of(j, (unsigned)i);
		counts[i] = 2;
		addrs[2 * i] = (uint64_t)(uintptr_t)vals[i], sizes[2 * i] = 1000;
		addrs[2 * i + 1] = (uint64_t)(uintptr_t)(vals[i] + 1000), sizes[2 * i + 1] = SIZE - 1000;
	}
	size_t klen = keys(ks, "lent/", COUNT);
	CHECK(hmc_kv_batch_put(c, COUNT, ks, klen, counts, addrs, sizes, 1, 0, out));
	for (int i = 0; i < COUNT; i++) WANT(out[i] == 0);
	printf("READY %s\n", addr);
	fflush(stdout);
	char line[16];
	while (fgets(line, sizeof line, stdin)) {}
	CHECK(hmc_kv_client_close(c));
	CHECK(hmc_kv_master_stop(m));
	return 0;
}

static int use(const char *master) {
	uint64_t c;
	CHECK(hmc_kv_client_create(master, "127.0.0.1", NULL, NULL, 0, &c));
	static char ks[(COUNT + 1) * 16];
	int32_t yes[COUNT + 1];
	size_t klen = keys(ks, "lent/", COUNT);
	memcpy(ks + klen, "nothing", 8);
	CHECK(hmc_kv_batch_exist(c, COUNT + 1, ks, klen + 8, yes));
	for (int i = 0; i < COUNT; i++) WANT(yes[i] == 1);
	WANT(yes[COUNT] == 0);
	/* The lender's objects, each scattered over two parts of one buffer, 64 bytes apart. */
	static unsigned char buf[COUNT][SIZE + 64];
	uint32_t counts[COUNT + 1];
	uint64_t addrs[2 * COUNT + 2], sizes[2 * COUNT + 2];
	int64_t got[COUNT + 1];
	for (int i = 0; i <= COUNT; i++) {
		int b = i < COUNT ? i : 0;
		counts[i] = 2;
		addrs[2 * i] = (uint64_t)(uintptr_t)buf[b], sizes[2 * i] = 777;
		addrs[2 * i + 1] = (uint64_t)(uintptr_t)(buf[b] + 777 + 64), sizes[2 * i + 1] = SIZE - 777;
	}
	CHECK(hmc_kv_batch_get(c, COUNT + 1, ks, klen + 8, counts, addrs, sizes, got));
	for (int i = 0; i < COUNT; i++) {
		WANT(got[i] == SIZE);
		for (size_t j = 0; j < SIZE; j++) {
			size_t at = j < 777 ? j : j + 64;
			if (buf[i][at] != byte_of(j, (unsigned)i)) { fprintf(stderr, "lent/%d byte %zu differs\n", i, j); return 1; }
		}
	}
	WANT(got[COUNT] == -704); /* OBJECT_NOT_FOUND */
	/* Its own objects, one part each, into the lender's segment; read back whole. */
	static unsigned char mine[8][4096], back[8][4096];
	static char mk[8 * 16];
	uint64_t ma[8], ms[8], ba[8], bs[8];
	int32_t pout[8];
	for (int i = 0; i < 8; i++) {
		for (size_t j = 0; j < 4096; j++) mine[i][j] = byte_of(j, 100u + (unsigned)i);
		ma[i] = (uint64_t)(uintptr_t)mine[i], ms[i] = 4096, ba[i] = (uint64_t)(uintptr_t)back[i], bs[i] = 4096;
	}
	size_t mlen = keys(mk, "mine/", 8);
	CHECK(hmc_kv_batch_put(c, 8, mk, mlen, NULL, ma, ms, 1, 0, pout));
	for (int i = 0; i < 8; i++) WANT(pout[i] == 0);
	CHECK(hmc_kv_batch_put(c, 8, mk, mlen, NULL, ma, ms, 1, 0, pout));
	for (int i = 0; i < 8; i++) WANT(pout[i] == -705); /* OBJECT_ALREADY_EXISTS */
	int64_t bgot[8];
	CHECK(hmc_kv_batch_get(c, 8, mk, mlen, NULL, ba, bs, bgot));
	for (int i = 0; i < 8; i++) WANT(bgot[i] == 4096 && memcmp(back[i], mine[i], 4096) == 0);
	/* A buffer shorter than the object: INVALID_PARAMS for that key, as Mooncake's get_into. */
	bs[0] = 100;
	CHECK(hmc_kv_batch_get(c, 1, mk, 7, NULL, ba, bs, bgot));
	WANT(bgot[0] == -600);
	/* Bad calls: codes, never a crash. */
	WANT(hmc_kv_batch_put(c, 8, mk, mlen, NULL, ma, ms, 1, 0, NULL) == -600);
	WANT(hmc_kv_batch_get(c, 9, mk, mlen, NULL, ba, bs, bgot) == -600); /* 8 keys in the buffer */
	WANT(hmc_kv_batch_exist(987654321, 1, mk, 7, yes) == -600);         /* no such client */
	int32_t rout[8];
	CHECK(hmc_kv_batch_remove(c, 8, mk, mlen, 1, rout));
	for (int i = 0; i < 8; i++) WANT(rout[i] == 0);
	CHECK(hmc_kv_client_close(c));
	printf("all checks passed\n");
	return 0;
}

int main(int argc, char **argv) {
	if (argc == 2 && strcmp(argv[1], "lend") == 0) return lend();
	if (argc == 3 && strcmp(argv[1], "use") == 0) return use(argv[2]);
	fprintf(stderr, "usage: kv_pool lend | kv_pool use MASTER\n");
	return 2;
}
