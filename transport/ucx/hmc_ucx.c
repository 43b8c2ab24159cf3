//go:build ucx && cgo

// The C side of the UCX transport; see hmc_ucx.h.
#define _GNU_SOURCE
#include <malloc.h>
#include <stdio.h>
#include <string.h>
#include <uct/api/uct.h>
#include "hmc_ucx.h"

ucs_status_t hmc_ucp_init(const char *tls, ucp_context_h *ctx) {
	ucp_config_t *cfg;
	ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
	if (st != UCS_OK) return st;
	if (tls != NULL && tls[0] != 0) {
		st = ucp_config_modify(cfg, "TLS", tls);
		if (st != UCS_OK) { ucp_config_release(cfg); return st; }
	}
	// UCX 1.13 moves RMA over tcp as active messages of at most TCP_TX_SEG_SIZE (8 KiB by
	// default), each answered by a completion message: a 64 KiB put is 8 messages and 8
	// answers. Segments as large as UCX's receive segments (64 KiB by default) make it one
	// and one: 2.3x the bandwidth at 64 KiB, the same latency at 8 bytes
	// (docs/performance.md). Either variable set in the environment keeps UCX's own choice.
	if (getenv("UCX_TCP_TX_SEG_SIZE") == NULL && getenv("UCX_TCP_RX_SEG_SIZE") == NULL) {
		(void)ucp_config_modify(cfg, "TX_SEG_SIZE", "64K"); // applied to the transports that have it: tcp
	}
	ucp_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
	p.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
	p.mt_workers_shared = 1; // workers of several Transports, and NewHostBuffer, share it
	st = ucp_init(&p, cfg, ctx);
	ucp_config_release(cfg);
	return st;
}

// UCX allocates len bytes and maps them: *addr is where.
ucs_status_t hmc_mem_alloc(ucp_context_h ctx, size_t len, ucp_mem_h *memh, void **addr) {
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
	p.length = len;
	p.flags = UCP_MEM_MAP_ALLOCATE;
	ucs_status_t st = ucp_mem_map(ctx, &p, memh);
	if (st != UCS_OK) return st;
	ucp_mem_attr_t a;
	memset(&a, 0, sizeof a);
	a.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
	st = ucp_mem_query(*memh, &a);
	if (st == UCS_OK && (a.address == NULL || a.length < len)) st = UCS_ERR_NO_MEMORY;
	if (st != UCS_OK) { ucp_mem_unmap(ctx, *memh); return st; }
	*addr = a.address;
	return UCS_OK;
}

ucs_status_t hmc_worker_create(ucp_context_h ctx, ucp_worker_h *w) {
	ucp_worker_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	p.thread_mode = UCS_THREAD_MODE_SERIALIZED;
	return ucp_worker_create(ctx, &p, w);
}

ucs_status_t hmc_mem_map(ucp_context_h ctx, void *addr, size_t len, ucp_mem_h *memh) {
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
	p.address = addr;
	p.length = len;
	return ucp_mem_map(ctx, &p, memh);
}

static void hmc_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status) {
	*(volatile int *)arg = (int)status;
}

ucs_status_t hmc_ep_create(ucp_worker_h w, const void *addr, int *errflag, int peer_mode, ucp_ep_h *ep) {
	ucp_ep_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
	               UCP_EP_PARAM_FIELD_ERR_HANDLER;
	p.address = (const ucp_address_t *)addr;
	p.err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
	p.err_handler.cb = hmc_err_cb;
	p.err_handler.arg = errflag;
	return ucp_ep_create(w, &p, ep);
}

// Requests: NULL = done at once; an error pointer becomes *st; else the request to poll.
// The local buffer's registration (memh) goes with each operation, so that UCX can use it
// instead of looking one up or registering on demand. (It did not stop UCX 1.13 from crashing
// when a forced close purges queued zero-copy puts: Close flushes first for that.)
void *hmc_put(ucp_ep_h ep, void *buf, size_t n, uint64_t raddr, ucp_rkey_h rkey, ucp_mem_h memh, ucs_status_t *st) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	if (memh != NULL) { // memory UCX registered; else UCX registers (or copies) it itself
		p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
		p.memh = memh;
	}
	ucs_status_ptr_t r = ucp_put_nbx(ep, buf, n, raddr, rkey, &p);
	if (UCS_PTR_IS_ERR(r)) { *st = UCS_PTR_STATUS(r); return NULL; }
	*st = UCS_OK;
	return r;
}

void *hmc_get(ucp_ep_h ep, void *buf, size_t n, uint64_t raddr, ucp_rkey_h rkey, ucp_mem_h memh, ucs_status_t *st) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	if (memh != NULL) {
		p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
		p.memh = memh;
	}
	ucs_status_ptr_t r = ucp_get_nbx(ep, buf, n, raddr, rkey, &p);
	if (UCS_PTR_IS_ERR(r)) { *st = UCS_PTR_STATUS(r); return NULL; }
	*st = UCS_OK;
	return r;
}

void *hmc_flush(ucp_ep_h ep, ucs_status_t *st) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	ucs_status_ptr_t r = ucp_ep_flush_nbx(ep, &p);
	if (UCS_PTR_IS_ERR(r)) { *st = UCS_PTR_STATUS(r); return NULL; }
	*st = UCS_OK;
	return r;
}

void *hmc_ep_close(ucp_ep_h ep, int force) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
	ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
	if (UCS_PTR_IS_ERR(r)) return NULL;
	return r;
}

ucs_status_t hmc_req_status(void *r) { return ucp_request_check_status(r); }

// Progresses w until it has been idle for 100 rounds in a row (100000 rounds at most), so that
// what UCX releases from its progress (requests of force-closed endpoints) is released before
// the worker is destroyed.
void hmc_drain(ucp_worker_h w) {
	for (int i = 0, idle = 0; i < 100000 && idle < 100; i++) idle = ucp_worker_progress(w) ? 0 : idle + 1;
}


// A put and, if flush, a flush of its endpoint, then one round of progress: one call per put
// on the data path. r is the worker's. Every handle is C memory, passed as an integer so that
// the call skips cgo's pointer checks (five per call otherwise).
void hmc_post_put(uintptr_t w, uintptr_t ep, uintptr_t buf, size_t n, uint64_t raddr, uintptr_t rkey,
                         uintptr_t memh, int flush, uintptr_t posted) {
	hmc_posted *r = (hmc_posted *)posted;
	r->preq = hmc_put((ucp_ep_h)ep, (void *)buf, n, raddr, (ucp_rkey_h)rkey, (ucp_mem_h)memh, &r->pst);
	r->freq = NULL;
	r->fst = UCS_OK;
	if (flush && r->pst == UCS_OK) r->freq = hmc_flush((ucp_ep_h)ep, &r->fst);
	ucp_worker_progress((ucp_worker_h)w);
}

// Posts n puts (put != 0) or gets, piece i between bufs[i] and the target's raddrs[i] under
// rkeys[i], then one flush that completes them all: one cgo call for a vector. The pieces'
// requests are released at once (UCX completes them anyway; the flush is what the caller
// waits for). posted gets the first piece's failure (pst; later pieces are not posted) and the
// flush's request and status (freq, fst); the flush is issued even after a failure, so that
// every posted piece is complete when it is.
void hmc_post_vec(uintptr_t w, uintptr_t ep, int put, int n, const uintptr_t *bufs, const size_t *lens,
                  const uint64_t *raddrs, const uintptr_t *rkeys, uintptr_t posted) {
	hmc_posted *r = (hmc_posted *)posted;
	r->preq = NULL;
	r->pst = UCS_OK;
	for (int i = 0; i < n; i++) {
		ucs_status_t st;
		void *q = put ? hmc_put((ucp_ep_h)ep, (void *)bufs[i], lens[i], raddrs[i], (ucp_rkey_h)rkeys[i], NULL, &st)
		              : hmc_get((ucp_ep_h)ep, (void *)bufs[i], lens[i], raddrs[i], (ucp_rkey_h)rkeys[i], NULL, &st);
		if (st != UCS_OK) {
			r->pst = st;
			break;
		}
		if (q != NULL) ucp_request_free(q);
	}
	r->freq = hmc_flush((ucp_ep_h)ep, &r->fst);
	ucp_worker_progress((ucp_worker_h)w);
}

// Progresses w until it has nothing more to do (64 rounds at most), then writes the status of
// each of the n requests reqs[i] into st[i] and frees those that completed. Returns whether
// anything progressed.
int hmc_poll(ucp_worker_h w, const uintptr_t *reqs, ucs_status_t *st, int n) {
	int active = 0;
	for (int i = 0; i < 64 && ucp_worker_progress(w) != 0; i++) active = 1;
	for (int i = 0; i < n; i++) {
		st[i] = ucp_request_check_status((void *)reqs[i]);
		if (st[i] != UCS_INPROGRESS) ucp_request_free((void *)reqs[i]);
	}
	return active;
}

// Resources: every (component, md, transport, device), as "c\tmd\ttl\tdev\n" lines.
char *hmc_resources(ucs_status_t *st) {
	uct_component_h *comps;
	unsigned ncomps;
	size_t cap = 4096, len = 0;
	char *out = malloc(cap);
	out[0] = 0;
	*st = uct_query_components(&comps, &ncomps);
	if (*st != UCS_OK) return out;
	for (unsigned i = 0; i < ncomps; i++) {
		uct_component_attr_t ca;
		memset(&ca, 0, sizeof ca);
		ca.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
		if (uct_component_query(comps[i], &ca) != UCS_OK) continue;
		uct_md_resource_desc_t *mds = calloc(ca.md_resource_count + 1, sizeof *mds);
		ca.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
		ca.md_resources = mds;
		if (uct_component_query(comps[i], &ca) != UCS_OK) { free(mds); continue; }
		for (unsigned m = 0; m < ca.md_resource_count; m++) {
			uct_md_config_t *mc;
			if (uct_md_config_read(comps[i], NULL, NULL, &mc) != UCS_OK) continue;
			uct_md_h md;
			ucs_status_t s = uct_md_open(comps[i], mds[m].md_name, mc, &md);
			uct_config_release(mc);
			if (s != UCS_OK) continue;
			uct_tl_resource_desc_t *tls;
			unsigned ntl;
			if (uct_md_query_tl_resources(md, &tls, &ntl) == UCS_OK) {
				for (unsigned k = 0; k < ntl; k++) {
					size_t need = strlen(ca.name) + strlen(mds[m].md_name) + strlen(tls[k].tl_name) + strlen(tls[k].dev_name) + 8;
					if (len + need >= cap) { cap = 2 * (len + need); out = realloc(out, cap); }
					len += snprintf(out + len, cap - len, "%s\t%s\t%s\t%s\n", ca.name, mds[m].md_name, tls[k].tl_name, tls[k].dev_name);
				}
				uct_release_tl_resource_list(tls);
			}
			uct_md_close(md);
		}
		free(mds);
	}
	uct_release_component_list(comps);
	return out;
}

// A 64-bit atomic on raddr: op is a ucp_atomic_op_t; io[0] holds the operand (for CSWAP the
// value compared with) and io[1] the value to swap in (CSWAP) or nothing; the word's previous
// value lands in io[1] when the request completes (at once if the return is NULL and *st OK).
// io is C memory that lives until then.
void *hmc_atomic(ucp_ep_h ep, int op, uint64_t *io, uint64_t raddr, ucp_rkey_h rkey, ucs_status_t *st) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
	p.datatype = ucp_dt_make_contig(8);
	p.reply_buffer = &io[1];
	ucs_status_ptr_t r = ucp_atomic_op_nbx(ep, (ucp_atomic_op_t)op, &io[0], 1, raddr, rkey, &p);
	if (UCS_PTR_IS_ERR(r)) { *st = UCS_PTR_STATUS(r); return NULL; }
	*st = UCS_OK;
	return r;
}

// Queues a received message for the Go side (hmc_amrx). It returns UCS_INPROGRESS when it
// holds UCX's data, which hmc_am_free gives back.
static ucs_status_t hmc_queue(hmc_amq *q, int kind, const void *header, size_t hlen, void *data, size_t len,
                              const ucp_am_recv_param_t *p) {
	hmc_amrx *m = malloc(sizeof *m + hlen);
	if (m == NULL) return UCS_OK;
	memset(m, 0, sizeof *m);
	m->kind = kind;
	m->hdr = (char *)(m + 1);
	memcpy(m->hdr, header, hlen);
	m->hlen = hlen;
	if (p->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) m->reply_ep = p->reply_ep;
	m->len = data != NULL ? len : 0;
	ucs_status_t ret = UCS_OK;
	if (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) { // only PUTVs come so
		m->data = data; // the descriptor: hmc_am_recv or hmc_am_free takes it
		m->rndv = 1;
		ret = UCS_INPROGRESS;
	} else if (data != NULL && (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA)) {
		m->data = data; // held: given back by hmc_am_free
		m->release = 1;
		ret = UCS_INPROGRESS;
	} else if (data != NULL && len > 0) {
		m->data = malloc(len);
		if (m->data == NULL) { free(m); return UCS_OK; }
		memcpy(m->data, data, len);
	}
	if (q->tail) q->tail->next = m; else q->head = m;
	q->tail = m;
	return ret;
}

// PUTV and GETV handlers (target): queue the message for the Go side, which checks every piece
// against the regions the sender's link was granted before it copies or receives anything. A
// PUTV comes eagerly (its bytes here, assembled) or, from version-4 initiators, as a rendezvous
// (its bytes received later straight into the pieces, hmc_am_recv); a GETV only eagerly. A
// rendezvous GETV is never sent, nor a message without a reply endpoint: such a message is
// dropped, and its sender fails when the endpoint fails or closes.
static ucs_status_t hmc_on_putv(void *arg, const void *header, size_t hlen, void *data, size_t len,
                                const ucp_am_recv_param_t *p) {
	if (!(p->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;
	return hmc_queue(arg, HMC_AM_PUTV, header, hlen, data, len, p);
}

static ucs_status_t hmc_on_getv(void *arg, const void *header, size_t hlen, void *data, size_t len,
                                const ucp_am_recv_param_t *p) {
	if ((p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || !(p->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;
	return hmc_queue(arg, HMC_AM_GETV, header, hlen, NULL, 0, p);
}

// DATA handler (initiator): a GETV's answer, header u64 seq, u64 status, the pieces' bytes.
static ucs_status_t hmc_on_data(void *arg, const void *header, size_t hlen, void *data, size_t len,
                                const ucp_am_recv_param_t *p) {
	if ((p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || hlen != 16) return UCS_OK;
	return hmc_queue(arg, HMC_AM_DATA, header, hlen, data, len, p);
}

// ACK handler (initiator): a PUTV's answer, header u64 seq, u64 status.
static ucs_status_t hmc_on_ack(void *arg, const void *header, size_t hlen, void *data, size_t len,
                               const ucp_am_recv_param_t *p) {
	if ((p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || hlen != 16) return UCS_OK;
	return hmc_queue(arg, HMC_AM_ACK, header, hlen, NULL, 0, p);
}

// Sets w's handlers of the four messages, their queue in q, and q->max_header.
ucs_status_t hmc_am_init(ucp_worker_h w, hmc_amq *q) {
	ucp_worker_attr_t a;
	memset(&a, 0, sizeof a);
	a.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
	ucs_status_t st = ucp_worker_query(w, &a);
	if (st != UCS_OK) return st;
	q->max_header = a.max_am_header;
	ucp_am_handler_param_t h;
	memset(&h, 0, sizeof h);
	h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
	               UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
	h.flags = UCP_AM_FLAG_WHOLE_MSG;
	h.arg = q;
	h.id = HMC_AM_PUTV;
	h.cb = hmc_on_putv;
	if ((st = ucp_worker_set_am_recv_handler(w, &h)) != UCS_OK) return st;
	h.id = HMC_AM_ACK;
	h.cb = hmc_on_ack;
	if ((st = ucp_worker_set_am_recv_handler(w, &h)) != UCS_OK) return st;
	h.id = HMC_AM_GETV;
	h.cb = hmc_on_getv;
	if ((st = ucp_worker_set_am_recv_handler(w, &h)) != UCS_OK) return st;
	h.id = HMC_AM_DATA;
	h.cb = hmc_on_data;
	return ucp_worker_set_am_recv_handler(w, &h);
}

hmc_amrx *hmc_am_pop(hmc_amq *q) {
	hmc_amrx *m = q->head;
	if (m) {
		q->head = m->next;
		if (!q->head) q->tail = NULL;
		m->next = NULL;
	}
	return m;
}

// Sends m's answer on ep, message id (HMC_AM_ACK or HMC_AM_DATA): a header of seq and status
// in m, then len bytes of m->out (malloc'd by the caller; NULL when len is 0), both live until
// the request completes (then hmc_am_free).
void *hmc_am_answer(ucp_ep_h ep, hmc_amrx *m, unsigned id, uint64_t seq, uint64_t status, size_t len, ucs_status_t *st) {
	m->ack[0] = seq;
	m->ack[1] = status;
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = UCP_AM_SEND_FLAG_EAGER;
	ucs_status_ptr_t r = ucp_am_send_nbx(ep, id, m->ack, 16, m->out, len, &p);
	if (UCS_PTR_IS_ERR(r)) { *st = UCS_PTR_STATUS(r); return NULL; }
	*st = UCS_OK;
	return r;
}

// Receives a rendezvous PUTV's bytes (m->data, its descriptor) straight into its n pieces (iov:
// n ucp_dt_iov_t, live until the request completes). UCX owns the descriptor from here, whether
// or not the receive starts.
void *hmc_am_recv(ucp_worker_h w, hmc_amrx *m, void *iov, size_t n, ucs_status_t *st) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
	p.datatype = ucp_dt_make_iov();
	void *desc = m->data;
	m->data = NULL;
	m->rndv = 0;
	ucs_status_ptr_t r = ucp_am_recv_data_nbx(w, desc, iov, n, &p);
	if (UCS_PTR_IS_ERR(r)) { *st = UCS_PTR_STATUS(r); return NULL; }
	*st = UCS_OK;
	return r;
}

// Frees m and what it holds. A rendezvous PUTV whose bytes were not received (refused) is
// declined: UCX completes its sender's send without moving the bytes.
void hmc_am_free(ucp_worker_h w, hmc_amrx *m) {
	if (m->release || m->rndv) ucp_am_data_release(w, m->data);
	else free(m->data);
	free(m->out);
	free(m);
}

// Frees every queued message (the worker is going away).
void hmc_am_drop(ucp_worker_h w, hmc_amq *q) {
	for (hmc_amrx *m; (m = hmc_am_pop(q)) != NULL;) hmc_am_free(w, m);
}

// Posts one PUTV or GETV (id): hdr (hlen bytes, followed in its allocation by the n
// ucp_dt_iov_t of a PUTV's pieces; n is 0 for a GETV, which carries no data), eagerly or (rndv,
// a PUTV to a version-4 target) as a rendezvous, asking for a reply endpoint at the target.
// hdr's allocation and the pieces must live until the request completes.
_Static_assert(sizeof(ucp_dt_iov_t) == 16, "ucp_dt_iov_t is a pointer and a size_t (am.go writes them)");
void *hmc_post_am(uintptr_t ep, unsigned id, uintptr_t hdr, size_t hlen, size_t n, int rndv, ucs_status_t *st) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = UCP_AM_SEND_FLAG_REPLY | (rndv ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER);
	void *data = NULL;
	if (n > 0) {
		p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
		p.datatype = ucp_dt_make_iov();
		data = (char *)hdr + hlen;
	}
	ucs_status_ptr_t r = ucp_am_send_nbx((ucp_ep_h)ep, id, (void *)hdr, hlen, data, n, &p);
	if (UCS_PTR_IS_ERR(r)) { *st = UCS_PTR_STATUS(r); return NULL; }
	*st = UCS_OK;
	return r;
}

// Whether ep has no RMA lane but tcp ones, where UCX 1.13 emulates each put with messages: its
// rma_bw lanes are all tcp ("lane[i]: k:tcp/dev ... rma_bw#j"), or it has none and UCP moves
// RMA over its active-message lanes (as with peer failure handling over tcp).
int hmc_ep_rma_emulated(ucp_ep_h ep) {
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (f == NULL) return 0;
	ucp_ep_print_info(ep, f);
	fclose(f);
	int lanes = 0, native = 0;
	char *save = NULL;
	for (char *line = strtok_r(buf, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
		char *l = strstr(line, "lane[");
		if (l == NULL) continue;
		lanes++;
		if (strstr(line, "rma_bw") == NULL) continue;
		char *c = strchr(l, ':'); // "lane[0]:  0:tcp/lo.0 ..."
		if (c != NULL) c = strchr(c + 1, ':');
		if (c == NULL || strncmp(c + 1, "tcp/", 4) != 0) native++;
	}
	free(buf);
	return lanes > 0 && native == 0;
}

/* hmc_tune_malloc sets glibc's mmap and trim thresholds (mallopt); 1 when both were set, 0
   where this C library has no mallopt or refused a value. */
int hmc_tune_malloc(int mmap_threshold, int trim_threshold) {
#ifdef __GLIBC__
    return mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 && mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1;
#else
    (void)mmap_threshold;
    (void)trim_threshold;
    return 0;
#endif
}

/* hmc_malloc_mapped says whether a malloc of n bytes gets a mapping of its own: 1 yes, 0 no,
   -1 unknown (no glibc, or no memory). */
int hmc_malloc_mapped(size_t n) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    size_t before = mallinfo2().hblks;
    void *p = malloc(n);
    if (p == NULL) {
        return -1;
    }
    int mapped = mallinfo2().hblks > before;
    free(p);
    return mapped;
#else
    (void)n;
    return -1;
#endif
}
