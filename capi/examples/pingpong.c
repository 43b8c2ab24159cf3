/* Two processes exchange data through libhmc.so: the C example and the C test.
 *   pingpong server            -> prints "READY <data_port> <ctrl_port>", serves one client
 *   pingpong client DATA CTRL  -> runs the checks against that server
 * Exit status 0 means every check passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hmc.h"

#define CHECK(call) do { int rc_ = (call); if (rc_ != HMC_SUCCESS) { \
	fprintf(stderr, "%s:%d: %s = %s: %s\n", __FILE__, __LINE__, #call, hmc_status_string(rc_), hmc_last_error()); \
	exit(1); } } while (0)
#define EXPECT(call, want) do { int rc_ = (call); if (rc_ != (want)) { \
	fprintf(stderr, "%s:%d: %s = %s, want %s (%s)\n", __FILE__, __LINE__, #call, hmc_status_string(rc_), \
	        hmc_status_string(want), hmc_last_error()); exit(1); } } while (0)

enum { BUF = 8 << 20, N = 3 << 20, T = 20000 };

static void fill(unsigned char *p, size_t n, unsigned seed) {
	for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 31 + seed);
}

static int check(const unsigned char *p, size_t n, unsigned seed) {
	for (size_t i = 0; i < n; i++) if (p[i] != (unsigned char)(i * 31 + seed)) return 0;
	return 1;
}

static int server(void) {
	uint64_t s;
	CHECK(hmc_session_create(0, BUF, HMC_MEM_CPU, 2, "127.0.0.1", &s));
	CHECK(hmc_session_init_server(s, "127.0.0.1", 0, 0, 0, NULL, HMC_CONN_AUTO));
	printf("READY %d %d\n", hmc_session_data_port(s), hmc_session_ctrl_port(s));
	fflush(stdout);
	unsigned char *buf = (unsigned char *)(uintptr_t)hmc_buffer_ptr(s);
	uint64_t tag;
	/* 1: the client put N bytes at offset 0 and then sent tag 1: they must all be there. */
	CHECK(hmc_session_ctrl_recv(s, 1, &tag, T));
	if (tag != 1 || !check(buf, N, 7)) { fprintf(stderr, "server: put not visible\n"); return 1; }
	/* 2: fill for the client's gets, then say so. */
	fill(buf + BUF / 2, N, 9);
	CHECK(hmc_session_ctrl_send(s, 1, 2, T));
	/* 3: receive a stream larger than both buffers into host memory. */
	size_t big = 20u << 20;
	unsigned char *dst = malloc(big);
	uint64_t got = 0;
	CHECK(hmc_session_ctrl_recv(s, 1, &tag, T));
	CHECK(hmc_session_recv_data(s, "127.0.0.1", 0, (uint64_t)(uintptr_t)dst, big, HMC_MEM_CPU, 0, &got, HMC_CONN_AUTO, T));
	int ok = got == big && check(dst, big, 11);
	CHECK(hmc_session_ctrl_send(s, 1, ok ? 3 : 0, T));
	/* 4: raw control bytes. */
	char msg[64];
	uint16_t type;
	uint64_t n;
	CHECK(hmc_session_ctrl_recv_bytes(s, 1, &type, msg, sizeof msg, &n, T));
	if (n != 6 || memcmp(msg, "hello!", 6) != 0 || type != 2) { fprintf(stderr, "server: ctrl bytes\n"); return 1; }
	free(dst);
	CHECK(hmc_session_close_server(s));
	CHECK(hmc_session_destroy(s));
	return 0;
}

static int client(int data_port, int ctrl_port) {
	uint64_t s;
	CHECK(hmc_session_create(0, BUF, HMC_MEM_CPU, 2, "127.0.0.1", &s));
	CHECK(hmc_session_connect(s, 0, 1, "127.0.0.1", data_port, ctrl_port, NULL, HMC_CONN_AUTO, T));
	unsigned char *local = malloc(N);
	fill(local, N, 7);
	CHECK(hmc_buffer_write(s, local, N, 0));
	CHECK(hmc_session_put(s, "127.0.0.1", data_port, 0, 0, N, HMC_CONN_AUTO, T));
	CHECK(hmc_session_ctrl_send(s, 0, 1, T));
	uint64_t tag;
	CHECK(hmc_session_ctrl_recv(s, 0, &tag, T));
	/* NB gets in two halves, waited together; then a pipelined get of the same range. */
	uint64_t ids[2];
	CHECK(hmc_session_get_nb(s, "127.0.0.1", data_port, 0, BUF / 2, N / 2, HMC_CONN_AUTO, &ids[0]));
	CHECK(hmc_session_get_nb(s, "127.0.0.1", data_port, N / 2, BUF / 2 + N / 2, N - N / 2, HMC_CONN_AUTO, &ids[1]));
	CHECK(hmc_session_wait(s, ids, 2, T));
	CHECK(hmc_buffer_read(s, local, N, 0));
	if (!check(local, N, 9)) { fprintf(stderr, "client: NB get differs\n"); return 1; }
	CHECK(hmc_session_get_pipeline(s, "127.0.0.1", data_port, N, BUF / 2, N, 1 << 20, 2, HMC_CONN_AUTO, T));
	CHECK(hmc_buffer_read(s, local, N, N));
	if (!check(local, N, 9)) { fprintf(stderr, "client: pipelined get differs\n"); return 1; }
	/* Errors: overflow, stale handle, unknown peer, unknown id. */
	EXPECT(hmc_buffer_write(s, local, 16, BUF - 8), HMC_INVALID_CONFIG);
	EXPECT(hmc_session_put(s, "127.0.0.1", data_port, BUF - 1, 0, 2, HMC_CONN_AUTO, T), HMC_INVALID_CONFIG);
	EXPECT(hmc_session_put(s, "127.0.0.1", 1, 0, 0, 1, HMC_CONN_AUTO, T), HMC_NOT_FOUND);
	EXPECT(hmc_session_put(12345, "127.0.0.1", data_port, 0, 0, 1, HMC_CONN_AUTO, T), HMC_INVALID_CONFIG);
	EXPECT(hmc_session_wait(s, ids, 1, T), HMC_NOT_FOUND);
	EXPECT(hmc_session_put(s, "127.0.0.1", data_port, 0, 0, 1, HMC_CONN_UCX, T), HMC_UNSUPPORT);
	EXPECT(hmc_memory_probe(HMC_MEM_MOORE_GPU), HMC_UNSUPPORT);
	/* A stream of 20 MiB through 8 MiB buffers. */
	size_t big = 20u << 20;
	unsigned char *src = malloc(big);
	fill(src, big, 11);
	CHECK(hmc_session_ctrl_send(s, 0, 3, T));
	CHECK(hmc_session_send_data(s, "127.0.0.1", data_port, (uint64_t)(uintptr_t)src, big, HMC_MEM_CPU, 0, HMC_CONN_AUTO, T));
	CHECK(hmc_session_ctrl_recv(s, 0, &tag, T));
	if (tag != 3) { fprintf(stderr, "client: server saw a bad stream\n"); return 1; }
	CHECK(hmc_session_ctrl_send_bytes(s, 0, 2, "hello!", 6, T));
	/* Memory API on the host. */
	uint64_t m, a;
	CHECK(hmc_memory_open(0, HMC_MEM_CPU, &m));
	CHECK(hmc_memory_alloc(m, 100, &a));
	CHECK(hmc_memory_copy_h2d(m, a, "abc", 3));
	char back[3];
	CHECK(hmc_memory_copy_d2h(m, back, a, 3));
	if (memcmp(back, "abc", 3) != 0) { fprintf(stderr, "client: memory copy\n"); return 1; }
	CHECK(hmc_memory_free(m, a));
	EXPECT(hmc_memory_free(m, a), HMC_INVALID_CONFIG);
	CHECK(hmc_memory_close(m));
	/* A ConnBuffer on its own. */
	uint64_t cb, cbsize;
	int cbtype;
	CHECK(hmc_conn_buffer_create(0, 4096, HMC_MEM_CPU, &cb));
	CHECK(hmc_conn_buffer_info(cb, &cbsize, NULL, &cbtype));
	if (cbsize != 4096 || cbtype != HMC_MEM_CPU) { fprintf(stderr, "client: conn buffer info\n"); return 1; }
	CHECK(hmc_conn_buffer_write_cpu(cb, "0123456789", 10, 100));
	CHECK(hmc_conn_buffer_copy_within(cb, 102, 100, 10)); /* overlapping: memmove */
	char cbuf[12];
	CHECK(hmc_conn_buffer_read_cpu(cb, cbuf, 12, 100));
	if (memcmp(cbuf, "010123456789", 12) != 0) { fprintf(stderr, "client: copy within\n"); return 1; }
	EXPECT(hmc_conn_buffer_write_cpu(cb, cbuf, 12, 4090), HMC_INVALID_CONFIG);
	EXPECT(hmc_conn_buffer_write_gpu(cb, 0x1000, 4, 0), HMC_INVALID_CONFIG);
	CHECK(hmc_conn_buffer_destroy(cb));
	/* Two control planes in one process (no singleton): rank 5 listens, rank 6 dials. */
	uint64_t ca, cb2;
	CHECK(hmc_ctrl_create(&ca));
	CHECK(hmc_ctrl_create(&cb2));
	CHECK(hmc_ctrl_listen(ca, "127.0.0.1", 0, NULL));
	CHECK(hmc_ctrl_connect_tcp(cb2, 5, "127.0.0.1", hmc_ctrl_tcp_port(ca), 6, T));
	struct { int32_t x, y; uint64_t z; } pt = {1, -2, 3}, pt2;
	CHECK(hmc_ctrl_send_int(cb2, 5, -42, T));
	CHECK(hmc_ctrl_send_struct(cb2, 5, &pt, sizeof pt, T));
	int32_t iv;
	CHECK(hmc_ctrl_recv_int(ca, 6, &iv, T));
	CHECK(hmc_ctrl_recv_struct(ca, 6, &pt2, sizeof pt2, T));
	if (iv != -42 || pt2.x != 1 || pt2.y != -2 || pt2.z != 3) { fprintf(stderr, "client: ctrl plane\n"); return 1; }
	CHECK(hmc_ctrl_send_u64(ca, 6, 77, T));
	uint64_t u;
	CHECK(hmc_ctrl_recv_u64(cb2, 5, &u, T));
	if (u != 77) { fprintf(stderr, "client: ctrl u64\n"); return 1; }
	EXPECT(hmc_ctrl_recv_u64(ca, 6, &u, 50), HMC_TIMEOUT);
	CHECK(hmc_ctrl_close_all(ca));
	CHECK(hmc_ctrl_destroy(cb2));
	CHECK(hmc_ctrl_destroy(ca));
	EXPECT(hmc_ctrl_destroy(ca), HMC_INVALID_CONFIG);
	/* Diagnostics: the library's goroutine stacks, as a watchdog would read them. */
	uint64_t need = hmc_debug_stacks(NULL, 0);
	char stacks[64];
	if (need == 0 || hmc_debug_stacks(stacks, sizeof stacks) == 0 || strncmp(stacks, "goroutine ", 10) != 0 ||
	    strlen(stacks) != sizeof stacks - 1) {
		fprintf(stderr, "client: debug stacks\n");
		return 1;
	}
	free(src);
	free(local);
	CHECK(hmc_session_destroy(s));
	EXPECT(hmc_session_destroy(s), HMC_INVALID_CONFIG);
	printf("client: all checks passed\n");
	return 0;
}

int main(int argc, char **argv) {
	if (argc == 2 && strcmp(argv[1], "server") == 0) return server();
	if (argc == 4 && strcmp(argv[1], "client") == 0) return client(atoi(argv[2]), atoi(argv[3]));
	fprintf(stderr, "usage: %s server | client DATA_PORT CTRL_PORT\n", argv[0]);
	return 2;
}
