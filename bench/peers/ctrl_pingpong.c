/* ctrl_pingpong: the control-plane round trip of upstream HMC's CtrlSocketManager, in C, as the
 * peer `bench/compare-all.sh` measures `hmc`'s ctrl against: one 8-byte header + 8-byte tag
 * frame each way over a blocking socket (TCP_NODELAY on TCP), one thread per process.
 *
 *   ctrl_pingpong server uds PATH | tcp PORT        echo frames until the client hangs up
 *   ctrl_pingpong client uds PATH | tcp PORT ITERS  print "p50_us P mean_us M"
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int full(int fd, char *b, size_t n, int wr) {
	while (n > 0) {
		ssize_t r = wr ? write(fd, b, n) : read(fd, b, n);
		if (r <= 0) return -1;
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

static int sock(const char *kind, const char *where, int server) {
	int one = 1, fd;
	if (strcmp(kind, "uds") == 0) {
		struct sockaddr_un a = {.sun_family = AF_UNIX};
		snprintf(a.sun_path, sizeof a.sun_path, "%s", where);
		fd = socket(AF_UNIX, SOCK_STREAM, 0);
		if (server) {
			unlink(where);
			if (bind(fd, (void *)&a, sizeof a) || listen(fd, 1)) return -1;
			printf("READY\n");
			fflush(stdout);
			return accept(fd, 0, 0);
		}
		return connect(fd, (void *)&a, sizeof a) ? -1 : fd;
	}
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(where))};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (server) {
		if (bind(fd, (void *)&a, sizeof a) || listen(fd, 1)) return -1;
		printf("READY\n");
		fflush(stdout);
		fd = accept(fd, 0, 0);
	} else if (connect(fd, (void *)&a, sizeof a)) {
		return -1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv) {
	if (argc < 4) {
		fprintf(stderr, "usage: %s server|client uds PATH|tcp PORT [ITERS]\n", argv[0]);
		return 2;
	}
	int server = strcmp(argv[1], "server") == 0;
	int fd = sock(argv[2], argv[3], server);
	if (fd < 0) {
		perror("ctrl_pingpong");
		return 1;
	}
	char f[16] = {0};
	if (server) {
		while (full(fd, f, 16, 0) == 0 && full(fd, f, 16, 1) == 0) {
		}
		return 0;
	}
	int iters = argc > 4 ? atoi(argv[4]) : 10000, warm = 200;
	double *lat = malloc(sizeof(double) * (size_t)iters), sum = 0;
	f[0] = 1; /* TypeInt */
	f[4] = 8; /* length */
	for (int i = -warm; i < iters; i++) {
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		memcpy(f + 8, &i, sizeof i);
		if (full(fd, f, 16, 1) || full(fd, f, 16, 0)) {
			perror("ctrl_pingpong");
			return 1;
		}
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if (i >= 0) {
			lat[i] = (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
			sum += lat[i];
		}
	}
	qsort(lat, (size_t)iters, sizeof(double), cmp);
	printf("p50_us %.2f mean_us %.2f\n", lat[iters / 2], sum / iters);
	return 0;
}
