/* ucx_put_flush: UCX itself with HMC's completion guarantee, the peer that bench/compare-ucx.sh
 * measures beside ucx_perftest. ucx_perftest's ucp_put_bw counts a put done when it completes
 * locally and flushes once at the end, on buffers UCX allocated; an HMC put is done when its
 * bytes are visible at the target, on memory the application allocated. This program does the
 * latter with plain UCP calls: a sliding window of puts, each followed by ucp_ep_flush_nbx,
 * counts a put done when its flush completes. The buffers are ordinary memory registered with
 * ucp_mem_map, as HMC's memfd buffers are (hmc bench --ucx-alloc=false), or with -a memory UCX
 * allocated (ucp_mem_map ALLOCATE), as ucx_perftest's and hmc bench's default --ucx-alloc are:
 * UCX's shared-memory transports map the latter into the initiator, which then copies into it.
 *
 *   target:    ucx_put_flush -p PORT -s SIZE [-a]
 *   initiator: ucx_put_flush 127.0.0.1 -p PORT -s SIZE -n ITERS [-w WINDOW] [-a]   prints GB/s
 *
 * Build: cc -O2 -o ucx_put_flush bench/peers/ucx_put_flush.c $(pkg-config --cflags --libs ucx)
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#define CHECK(x, what) do { ucs_status_t s_ = (x); if (s_ != UCS_OK) { \
	fprintf(stderr, "%s: %s\n", what, ucs_status_string(s_)); exit(1); } } while (0)

static void xfer(int fd, void *p, size_t n, int send_) {
	char *c = p;
	while (n > 0) {
		ssize_t k = send_ ? write(fd, c, n) : read(fd, c, n);
		if (k <= 0) { perror(send_ ? "write" : "read"); exit(1); }
		c += k; n -= (size_t)k;
	}
}

static void send_blob(int fd, const void *p, uint64_t n) { xfer(fd, &n, 8, 1); xfer(fd, (void *)p, n, 1); }

static void *recv_blob(int fd, uint64_t *n) {
	xfer(fd, n, 8, 0);
	void *p = malloc(*n);
	xfer(fd, p, *n, 0);
	return p;
}

static void wait_req(ucp_worker_h w, void *r) {
	if (r == NULL) return;
	if (UCS_PTR_IS_ERR(r)) CHECK(UCS_PTR_STATUS(r), "request");
	while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(w);
	CHECK(ucp_request_check_status(r), "request");
	ucp_request_free(r);
}

int main(int argc, char **argv) {
	const char *host = NULL;
	int port = 13600, window = 16, ualloc = 0;
	size_t size = 65536;
	long iters = 1000, warm = 50;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-p") && i + 1 < argc) port = atoi(argv[++i]);
		else if (!strcmp(argv[i], "-s") && i + 1 < argc) size = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "-n") && i + 1 < argc) iters = atol(argv[++i]);
		else if (!strcmp(argv[i], "-w") && i + 1 < argc) window = atoi(argv[++i]);
		else if (!strcmp(argv[i], "-a")) ualloc = 1;
		else if (argv[i][0] != '-') host = argv[i];
		else { fprintf(stderr, "usage: %s [host] -p port -s size [-n iters] [-w window] [-a]\n", argv[0]); return 2; }
	}
	if (window < 1 || window > 1024 || size == 0) { fprintf(stderr, "bad window or size\n"); return 2; }

	ucp_config_t *cfg;
	CHECK(ucp_config_read(NULL, NULL, &cfg), "config");
	ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA};
	ucp_context_h ctx;
	CHECK(ucp_init(&pp, cfg, &ctx), "init");
	ucp_config_release(cfg);
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
	ucp_worker_h w;
	CHECK(ucp_worker_create(ctx, &wp, &w), "worker");

	void *buf = NULL;
	ucp_mem_h mem;
	if (ualloc) {
		ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS,
					   .length = size, .flags = UCP_MEM_MAP_ALLOCATE};
		CHECK(ucp_mem_map(ctx, &mp, &mem), "mem_map");
		ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
		CHECK(ucp_mem_query(mem, &ma), "mem_query");
		buf = ma.address;
	} else {
		if (posix_memalign(&buf, 4096, size)) { perror("alloc"); return 1; }
		ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
					   .address = buf, .length = size};
		CHECK(ucp_mem_map(ctx, &mp, &mem), "mem_map");
	}
	memset(buf, 1, size);

	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	inet_pton(AF_INET, host ? host : "127.0.0.1", &sa.sin_addr);
	int fd;
	if (host == NULL) { /* target: serve the region until the initiator hangs up */
		int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(ls, (void *)&sa, sizeof sa) || listen(ls, 1)) { perror("listen"); return 1; }
		fd = accept(ls, NULL, NULL);
		close(ls);
		ucp_address_t *addr;
		size_t alen, rlen;
		void *rkey;
		CHECK(ucp_worker_get_address(w, &addr, &alen), "address");
		CHECK(ucp_rkey_pack(ctx, mem, &rkey, &rlen), "rkey_pack");
		uint64_t base = (uint64_t)(uintptr_t)buf;
		send_blob(fd, addr, alen);
		send_blob(fd, rkey, rlen);
		xfer(fd, &base, 8, 1);
		ucp_rkey_buffer_release(rkey);
		ucp_worker_release_address(w, addr);
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		for (;;) { /* UCX over TCP needs the target to progress */
			ucp_worker_progress(w);
			if (poll(&pf, 1, 0) > 0) break;
		}
	} else {
		fd = socket(AF_INET, SOCK_STREAM, 0);
		for (int t = 0; connect(fd, (void *)&sa, sizeof sa); t++) {
			if (t == 100) { perror("connect"); return 1; }
			usleep(20000);
		}
		uint64_t alen, rlen, base;
		void *addr = recv_blob(fd, &alen), *rk = recv_blob(fd, &rlen);
		xfer(fd, &base, 8, 0);
		ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS, .address = addr};
		ucp_ep_h e;
		CHECK(ucp_ep_create(w, &ep, &e), "ep_create");
		ucp_rkey_h rkey;
		CHECK(ucp_ep_rkey_unpack(e, rk, &rkey), "rkey_unpack");
		void **ring = calloc((size_t)window, sizeof *ring);
		ucp_request_param_t rp = {0};
		struct timespec t0, t1;
		long head = 0;
		for (long i = 0; i < warm + iters; i++) {
			if (i == warm) { /* drain the warm-up, then time */
				for (; head < i; head++) wait_req(w, ring[head % window]);
				clock_gettime(CLOCK_MONOTONIC, &t0);
			}
			if (i - head == window) { wait_req(w, ring[head % window]); head++; }
			void *r = ucp_put_nbx(e, buf, size, base, rkey, &rp);
			if (UCS_PTR_IS_ERR(r)) CHECK(UCS_PTR_STATUS(r), "put");
			if (r != NULL) ucp_request_free(r); /* the flush below completes it */
			ring[i % window] = ucp_ep_flush_nbx(e, &rp);
		}
		for (; head < warm + iters; head++) wait_req(w, ring[head % window]);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		double sec = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
		printf("%.3f\n", (double)size * (double)iters / sec / 1e9);
		char bye = 0;
		xfer(fd, &bye, 1, 1);
		ucp_rkey_destroy(rkey);
		ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
		void *cr = ucp_ep_close_nbx(e, &cp); /* a forced close may end in an error status: fine */
		if (cr != NULL && !UCS_PTR_IS_ERR(cr)) {
			while (ucp_request_check_status(cr) == UCS_INPROGRESS) ucp_worker_progress(w);
			ucp_request_free(cr);
		}
		free(ring); free(addr); free(rk);
	}
	close(fd);
	ucp_mem_unmap(ctx, mem);
	ucp_worker_destroy(w);
	ucp_cleanup(ctx);
	if (!ualloc) free(buf); /* UCX's own went with ucp_mem_unmap */
	return 0;
}
