// hmc_ucx.h: the C side of the UCX transport (hmc_ucx.c), called from Go through cgo. Every
// call into UCX that the data path makes is one of these, so that a put or a poll is one cgo
// call.
#ifndef HMC_UCX_H
#define HMC_UCX_H

#include <stdint.h>
#include <stdlib.h>
#include <ucp/api/ucp.h>

// What hmc_post_put started: requests and statuses as hmc_put's.
typedef struct { void *preq, *freq; ucs_status_t pst, fst; } hmc_posted;

ucs_status_t hmc_ucp_init(const char *tls, ucp_context_h *ctx);
ucs_status_t hmc_mem_alloc(ucp_context_h ctx, size_t len, ucp_mem_h *memh, void **addr);
ucs_status_t hmc_worker_create(ucp_context_h ctx, ucp_worker_h *w);
ucs_status_t hmc_mem_map(ucp_context_h ctx, void *addr, size_t len, ucp_mem_h *memh);
ucs_status_t hmc_ep_create(ucp_worker_h w, const void *addr, int *errflag, int peer_mode, ucp_ep_h *ep);
void *hmc_put(ucp_ep_h ep, void *buf, size_t n, uint64_t raddr, ucp_rkey_h rkey, ucp_mem_h memh, ucs_status_t *st);
void *hmc_get(ucp_ep_h ep, void *buf, size_t n, uint64_t raddr, ucp_rkey_h rkey, ucp_mem_h memh, ucs_status_t *st);
void *hmc_flush(ucp_ep_h ep, ucs_status_t *st);
void *hmc_ep_close(ucp_ep_h ep, int force);
ucs_status_t hmc_req_status(void *r);
void hmc_drain(ucp_worker_h w);
void hmc_post_put(uintptr_t w, uintptr_t ep, uintptr_t buf, size_t n, uint64_t raddr, uintptr_t rkey,
                  uintptr_t memh, int flush, uintptr_t posted);
void hmc_post_vec(uintptr_t w, uintptr_t ep, int put, int n, const uintptr_t *bufs, const size_t *lens,
                  const uint64_t *raddrs, const uintptr_t *rkeys, uintptr_t posted);
int hmc_poll(ucp_worker_h w, const uintptr_t *reqs, ucs_status_t *st, int n);
char *hmc_resources(ucs_status_t *st);
void *hmc_atomic(ucp_ep_h ep, int op, uint64_t *io, uint64_t raddr, ucp_rkey_h rkey, ucs_status_t *st);

// Vector puts and gets as active messages (bootstrap version 3, docs/wire/ucx.md): PUTV carries
// a table of pieces in its header and their bytes as its data, and is answered by an ACK; GETV
// carries the table, and is answered by a DATA with the pieces' bytes.
enum { HMC_AM_PUTV = 0x48, HMC_AM_ACK = 0x49, HMC_AM_GETV = 0x4a, HMC_AM_DATA = 0x4b };

// A PUTV or GETV the target received, or an ACK or DATA the initiator received, queued by its
// handler for the Go side: the header copied, the data held (release: UCX's, given back with
// ucp_am_data_release; rndv: a rendezvous PUTV's descriptor, whose bytes hmc_am_recv receives
// or hmc_am_free declines; else malloc'd here).
typedef struct hmc_amrx {
	struct hmc_amrx *next;
	int kind; // HMC_AM_PUTV, HMC_AM_ACK, HMC_AM_GETV or HMC_AM_DATA
	ucp_ep_h reply_ep;
	void *out; // a GETV's answer (malloc'd), live until its send completes
	void *data;
	size_t len;
	int release;
	int rndv; // data is a rendezvous PUTV's descriptor, its bytes not received yet (len of them)
	uint64_t ack[2]; // the answer's header, live until its send completes
	size_t hlen;
	char *hdr; // hlen bytes, in the same allocation
} hmc_amrx;

// A worker's queue of received messages (head..tail).
typedef struct {
	hmc_amrx *head, *tail;
	size_t max_header; // the worker's largest AM header
} hmc_amq;

ucs_status_t hmc_am_init(ucp_worker_h w, hmc_amq *q);
hmc_amrx *hmc_am_pop(hmc_amq *q);
void *hmc_am_answer(ucp_ep_h ep, hmc_amrx *m, unsigned id, uint64_t seq, uint64_t status, size_t len, ucs_status_t *st);
void hmc_am_free(ucp_worker_h w, hmc_amrx *m);
void hmc_am_drop(ucp_worker_h w, hmc_amq *q);
void *hmc_post_am(uintptr_t ep, unsigned id, uintptr_t hdr, size_t hlen, size_t n, int rndv, ucs_status_t *st);
void *hmc_am_recv(ucp_worker_h w, hmc_amrx *m, void *iov, size_t n, ucs_status_t *st);
int hmc_ep_rma_emulated(ucp_ep_h ep);
int hmc_tune_malloc(int mmap_threshold, int trim_threshold);
int hmc_malloc_mapped(size_t n);

#endif
