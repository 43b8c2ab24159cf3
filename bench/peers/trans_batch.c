/* trans_batch: the transfer engine's batch call from C, for bench/compare-pybatch.sh: n blocks
 * of size bytes, no two adjacent (neighbours swapped, as bench/pybatch.py), written to a
 * `hmc trans bench --mode target` with hmc_trans_transfer for `seconds`; prints the median
 * batch time in µs. Links libhmc.so (go build -buildmode=c-shared ./capi).
 *
 *   trans_batch TARGET_ID N SIZE SECONDS
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hmc.h"

static double now_us(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static int fail(const char *what) {
	fprintf(stderr, "trans_batch: %s: %s\n", what, hmc_last_error());
	return 1;
}

int main(int argc, char **argv) {
	if (argc != 5) {
		fprintf(stderr, "usage: %s TARGET_ID N SIZE SECONDS\n", argv[0]);
		return 2;
	}
	const char *target = argv[1];
	uint64_t n = strtoull(argv[2], 0, 10), size = strtoull(argv[3], 0, 10);
	double seconds = atof(argv[4]);
	uint64_t e, local;
	if (hmc_trans_create("P2PHANDSHAKE", "127.0.0.1:0", 3, "shm,tcp", 10000, &e)) return fail("create");
	if (hmc_trans_malloc(e, n * size, &local)) return fail("malloc");
	static char js[1 << 16];
	uint64_t len = 0;
	if (hmc_trans_json(e, 1, target, js, sizeof js, &len, 10000)) return fail("the target's buffers");
	const char *a = strstr(js, "\"Addr\":");
	if (!a) {
		fprintf(stderr, "trans_batch: no buffer in %s\n", js);
		return 1;
	}
	uint64_t remote = strtoull(a + 7, 0, 10);
	uint64_t *srcs = malloc(n * 8), *dsts = malloc(n * 8), *lens = malloc(n * 8);
	for (uint64_t i = 0; i < n; i++) {
		uint64_t o = (i ^ 1) < n ? (i ^ 1) * size : i * size; /* neighbours swapped */
		srcs[i] = local + o;
		dsts[i] = remote + o;
		lens[i] = size;
	}
	size_t cap = 1 << 20, k = 0;
	double *lat = malloc(cap * sizeof *lat);
	for (double stop = now_us() + seconds * 1e6; now_us() < stop && k < cap; k++) {
		double t0 = now_us();
		if (hmc_trans_transfer(e, target, 1, srcs, dsts, lens, n, 0, 10000)) return fail("transfer");
		lat[k] = now_us() - t0;
	}
	qsort(lat, k, sizeof *lat, cmp);
	printf("%.1f\n", lat[k / 2]);
	hmc_trans_destroy(e);
	return 0;
}
