/*
 * hmc.h — the C API of HMC-Go (libhmc.so).
 *
 * Build:   go build -buildmode=c-shared -o libhmc.so ./capi
 * Link:    cc app.c -I capi -L . -lhmc
 *
 * Conventions
 *  - Every function returning int returns an HMC status code (hmc_status_t): 0 on success.
 *    On failure, hmc_last_error() returns a thread-local description of the last error on the
 *    calling thread (valid until the next failing call on that thread).
 *  - Objects are opaque uint64_t handles; 0 is never a valid handle. Handles are not reused, so
 *    a stale or foreign handle is reported as HMC_INVALID_CONFIG, never a crash.
 *  - Sizes and offsets are uint64_t. Device addresses are uint64_t; host memory is void*.
 *  - timeout_ms > 0 bounds a blocking call (HMC_TIMEOUT when it expires); <= 0 waits without a
 *    deadline. A dead peer turns into HMC_ERROR, not a hang.
 *  - All functions are thread-safe. No function exits or signals the process.
 */
#ifndef HMC_GO_H
#define HMC_GO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes: the integers of upstream HMC's status_t. */
typedef enum {
	HMC_SUCCESS = 0,
	HMC_ERROR = 1,          /* general failure: peer closed, protocol error, I/O */
	HMC_UNSUPPORT = 2,      /* memory type, library, device or transport not available */
	HMC_INVALID_CONFIG = 3, /* bad argument: range out of bounds, bad handle, bad address */
	HMC_TIMEOUT = 4,
	HMC_NOT_FOUND = 5       /* unknown peer, endpoint or operation id */
} hmc_status_t;

/* Memory types: upstream HMC's MemoryType values; HUAWEI_ASCEND_NPU is HMC-Go's 6. */
typedef enum {
	HMC_MEM_DEFAULT = 0, HMC_MEM_CPU = 1, HMC_MEM_NVIDIA_GPU = 2, HMC_MEM_AMD_GPU = 3,
	HMC_MEM_CAMBRICON_MLU = 4, HMC_MEM_MOORE_GPU = 5, HMC_MEM_HUAWEI_ASCEND_NPU = 6
} hmc_mem_type_t;

/* Connection types: RDMA and UCX as upstream, then TCP, SHM (same host) and AUTO. */
typedef enum {
	HMC_CONN_RDMA = 0, HMC_CONN_UCX = 1, HMC_CONN_TCP = 2, HMC_CONN_SHM = 3, HMC_CONN_AUTO = 4
} hmc_conn_type_t;

/* The description of the last failure on this thread ("" if none yet). */
const char *hmc_last_error(void);
/* "SUCCESS", "ERROR", ... for a status code. */
const char *hmc_status_string(int code);
/* Diagnostics: writes the stacks of every goroutine of the library (what a Go program prints on
 * SIGQUIT, which a library cannot catch) into buf, at most len-1 bytes and a NUL, and returns
 * the dump's length (at most 8 MiB); buf NULL asks for the length only. Meant for a watchdog
 * that finds a call stuck. */
uint64_t hmc_debug_stacks(char *buf, uint64_t len);

/* ---- Memory: device-agnostic allocation and copies ---- */

/* HMC_SUCCESS if memory of mem_type can be used here, else HMC_UNSUPPORT (see last error). */
int hmc_memory_probe(int mem_type);
/* Opens memory of mem_type on device_id (DEFAULT: first GPU, else CPU). */
int hmc_memory_open(int device_id, int mem_type, uint64_t *out_memory);
/* The resolved memory type of a memory handle, or -1. */
int hmc_memory_type(uint64_t memory);
/* Allocates size bytes; *out_addr receives the address (host or device). */
int hmc_memory_alloc(uint64_t memory, uint64_t size, uint64_t *out_addr);
int hmc_memory_free(uint64_t memory, uint64_t addr);
int hmc_memory_copy_h2d(uint64_t memory, uint64_t dst, const void *src, uint64_t n);
int hmc_memory_copy_d2h(uint64_t memory, void *dst, uint64_t src, uint64_t n);
int hmc_memory_copy_d2d(uint64_t memory, uint64_t dst, uint64_t src, uint64_t n);
/* Frees every allocation still live and releases the device. */
int hmc_memory_close(uint64_t memory);
/* Where addr lives, as the driver says: *kind 0 host, 1 pinned host, 2 device, 3 managed;
 * *device its ordinal; *vendor its memory type (CPU, NVIDIA_GPU, AMD_GPU). Any may be NULL. */
int hmc_memory_locate(uint64_t addr, int *kind, int *device, int *vendor);
/* Copies n bytes between any two addresses (host or device: unified addressing); returns when
 * the bytes are at dst. Device copies run on the legacy default stream. */
int hmc_memory_copy(uint64_t dst, uint64_t src, uint64_t n);
/* A non-blocking stream of device device_id (an emulated one under HMC_EMULATE_GPU=1). */
int hmc_stream_create(int mem_type, int device_id, uint64_t *out_stream);
/* Waits for the stream's work; addr is memory on its device (0: the first GPU). */
int hmc_stream_sync(uint64_t stream, uint64_t addr);
int hmc_stream_destroy(uint64_t stream, uint64_t addr);
/* Queues setting n bytes at the device address addr to v on stream; returns at once. */
int hmc_memory_memset_async(uint64_t addr, int v, uint64_t n, uint64_t stream);

/* ---- Session: a registered buffer (ConnBuffer) and a Communicator over it ---- */

/* Allocates a buffer_size-byte ConnBuffer of mem_type and a Communicator with num_chs lanes per
 * connection (0: default). local_ip (may be NULL) picks a Unix control socket for peers on the
 * same IP, as the Python SDK. */
int hmc_session_create(int device_id, uint64_t buffer_size, int mem_type, int num_chs,
                       const char *local_ip, uint64_t *out_session);
/* hmc_session_create whose every link (data and control) is authenticated: a shared secret
 * (secret_len bytes; none when 0) both ends prove at connect, and mutual TLS 1.3 from PEM files
 * on links that leave the host (tls_cert, tls_key: this side's; tls_ca: the authority every
 * peer's certificate is signed by; all NULL: no TLS). Peers need the same, or are refused with
 * ERROR (permission denied). */
int hmc_session_create_secure(int device_id, uint64_t buffer_size, int mem_type, int num_chs,
                              const char *local_ip, const void *secret, uint64_t secret_len,
                              const char *tls_cert, const char *tls_key, const char *tls_ca,
                              uint64_t *out_session);
/* Closes the Communicator and frees the buffer. */
int hmc_session_destroy(uint64_t session);

/* Control plane on bind_ip:ctrl_tcp_port (-1: none, 0: any) and on the Unix socket
 * <uds_dir>/hmc_ctrl_rank_<self_id>.sock (uds_dir NULL or "": none); data server(s) of conn on
 * bind_ip:data_port (0: any). Bind errors are returned. */
int hmc_session_init_server(uint64_t session, const char *bind_ip, int data_port,
                            int ctrl_tcp_port, uint32_t self_id, const char *uds_dir, int conn);
/* The data (TCP) and control (TCP) ports the session listens on, 0 if none, -1 on error. */
int hmc_session_data_port(uint64_t session);
int hmc_session_ctrl_port(uint64_t session);

/* Connects to rank peer_id at peer_ip:data_port; control over UDS in uds_dir when
 * CTRL_TRANSPORT=uds or the peer's IP equals local_ip, else TCP to peer_ip:ctrl_tcp_port. */
int hmc_session_connect(uint64_t session, uint32_t peer_id, uint32_t self_id, const char *peer_ip,
                        int data_port, int ctrl_tcp_port, const char *uds_dir, int conn,
                        int timeout_ms);
/* HMC_SUCCESS if connected (or connectable back), HMC_NOT_FOUND otherwise. */
int hmc_session_check_conn(uint64_t session, const char *ip, int port, int conn);
int hmc_session_disconnect(uint64_t session, const char *ip, int port, int conn);
/* Stops the data servers and the control plane. Never exits the process (upstream does). */
int hmc_session_close_server(uint64_t session);

/* One-sided transfers between the local buffer and the peer's: returns when the bytes are
 * visible at the target (put) or in the local buffer (get). */
int hmc_session_put(uint64_t session, const char *ip, int port, uint64_t local_off,
                    uint64_t remote_off, uint64_t n, int conn, int timeout_ms);
int hmc_session_get(uint64_t session, const char *ip, int port, uint64_t local_off,
                    uint64_t remote_off, uint64_t n, int conn, int timeout_ms);
/* Zero-copy forms: n bytes of the caller's host memory at src (dst) go to (come from) the
 * peer's buffer at remote_off, read or written in place by the transport instead of staged
 * through the local buffer. The memory must stay valid, and src unchanged, until they return. */
int hmc_session_put_from(uint64_t session, const char *ip, int port, const void *src, uint64_t n,
                         uint64_t remote_off, int conn, int timeout_ms);
int hmc_session_get_to(uint64_t session, const char *ip, int port, void *dst, uint64_t n,
                       uint64_t remote_off, int conn, int timeout_ms);
/* Non-blocking forms: *out_id (never 0) is passed to hmc_session_wait, in any order. */
int hmc_session_put_nb(uint64_t session, const char *ip, int port, uint64_t local_off,
                       uint64_t remote_off, uint64_t n, int conn, uint64_t *out_id);
int hmc_session_get_nb(uint64_t session, const char *ip, int port, uint64_t local_off,
                       uint64_t remote_off, uint64_t n, int conn, uint64_t *out_id);
/* Waits for count ids; every id is forgotten when it returns. */
int hmc_session_wait(uint64_t session, const uint64_t *ids, uint64_t count, int timeout_ms);
/* Chunked transfers with at most max_inflight chunks in flight (0: 4 MiB chunks, 64). */
int hmc_session_put_pipeline(uint64_t session, const char *ip, int port, uint64_t local_off,
                             uint64_t remote_off, uint64_t n, uint64_t chunk, int max_inflight,
                             int conn, int timeout_ms);
int hmc_session_get_pipeline(uint64_t session, const char *ip, int port, uint64_t local_off,
                             uint64_t remote_off, uint64_t n, uint64_t chunk, int max_inflight,
                             int conn, int timeout_ms);

/* Streams of any size and memory type through both buffers (the peer must be in the other
 * call). src/dst is a host pointer (mem_type CPU or DEFAULT) or a device address. The stream
 * overwrites the buffers. recv's capacity bounds the payload; *received gets its size. */
int hmc_session_send_data(uint64_t session, const char *ip, int port, uint64_t src, uint64_t n,
                          int mem_type, int device_id, int conn, int timeout_ms);
int hmc_session_recv_data(uint64_t session, const char *ip, int port, uint64_t dst,
                          uint64_t capacity, int mem_type, int device_id, uint64_t *received,
                          int conn, int timeout_ms);

/* Control messages to and from a rank: u64 tags (upstream ctrlSend/ctrlRecv), and raw frames of
 * type msg_type (0: CTRL_STRUCT; types from 0x100 are reserved). A receive waits for the peer
 * to connect. recv_bytes reports the message size in *n; a message larger than capacity is
 * dropped with HMC_INVALID_CONFIG. */
int hmc_session_ctrl_send(uint64_t session, uint32_t peer, uint64_t tag, int timeout_ms);
int hmc_session_ctrl_recv(uint64_t session, uint32_t peer, uint64_t *tag, int timeout_ms);
int hmc_session_ctrl_send_bytes(uint64_t session, uint32_t peer, uint16_t msg_type,
                                const void *data, uint64_t n, int timeout_ms);
int hmc_session_ctrl_recv_bytes(uint64_t session, uint32_t peer, uint16_t *msg_type, void *buf,
                                uint64_t capacity, uint64_t *n, int timeout_ms);

/* ---- The session's buffer (ConnBuffer): every range is checked, HMC_INVALID_CONFIG if
 * offset + n exceeds it, and nothing is touched ---- */
uint64_t hmc_buffer_size(uint64_t session);
/* The buffer's base address (host pointer for CPU buffers, device address otherwise). */
uint64_t hmc_buffer_ptr(uint64_t session);
int hmc_buffer_write(uint64_t session, const void *src, uint64_t n, uint64_t off);
int hmc_buffer_read(uint64_t session, void *dst, uint64_t n, uint64_t off);
int hmc_buffer_write_gpu(uint64_t session, uint64_t src, uint64_t n, uint64_t off);
int hmc_buffer_read_gpu(uint64_t session, uint64_t dst, uint64_t n, uint64_t off);
/* Copies between device memory (mem_type on device_id) and the buffer: device to device when the
 * buffer lives on that device, else staged through the host buffer (g2h2g). */
int hmc_buffer_write_device(uint64_t session, uint64_t src, uint64_t n, uint64_t off, int mem_type,
                            int device_id);
int hmc_buffer_read_device(uint64_t session, uint64_t dst, uint64_t n, uint64_t off, int mem_type,
                           int device_id);
int hmc_buffer_copy_within(uint64_t session, uint64_t dst_off, uint64_t src_off, uint64_t n);

/* ---- ConnBuffer on its own: a registered buffer addressed by offset ---- */
int hmc_conn_buffer_create(int device_id, uint64_t size, int mem_type, uint64_t *out_buffer);
int hmc_conn_buffer_destroy(uint64_t buffer);
/* Any of the out pointers may be NULL. */
int hmc_conn_buffer_info(uint64_t buffer, uint64_t *size, uint64_t *ptr, int *mem_type);
int hmc_conn_buffer_write_cpu(uint64_t buffer, const void *src, uint64_t n, uint64_t off);
int hmc_conn_buffer_read_cpu(uint64_t buffer, void *dst, uint64_t n, uint64_t off);
/* Device addresses on the buffer's own device; HMC_INVALID_CONFIG on a CPU buffer (as upstream). */
int hmc_conn_buffer_write_gpu(uint64_t buffer, uint64_t src, uint64_t n, uint64_t off);
int hmc_conn_buffer_read_gpu(uint64_t buffer, uint64_t dst, uint64_t n, uint64_t off);
int hmc_conn_buffer_copy_within(uint64_t buffer, uint64_t dst_off, uint64_t src_off, uint64_t n);

/* ---- The control plane on its own (upstream CtrlSocketManager; no singleton: one per handle).
 * Frames are HMC's 8-byte little-endian CtrlMsgHeader; a connection starts with a HELLO
 * carrying the dialer's rank. ---- */
int hmc_ctrl_create(uint64_t *out_ctrl);
/* TCP on bind_ip:tcp_port (-1: none, 0: any) and/or a Unix socket at uds_path (NULL: none). */
int hmc_ctrl_listen(uint64_t ctrl, const char *bind_ip, int tcp_port, const char *uds_path);
int hmc_ctrl_tcp_port(uint64_t ctrl);
int hmc_ctrl_connect_tcp(uint64_t ctrl, uint32_t peer_id, const char *ip, int port, uint32_t self_id,
                         int timeout_ms);
int hmc_ctrl_connect_uds(uint64_t ctrl, uint32_t peer_id, const char *path, uint32_t self_id,
                         int timeout_ms);
int hmc_ctrl_send_u64(uint64_t ctrl, uint32_t peer, uint64_t v, int timeout_ms);
int hmc_ctrl_recv_u64(uint64_t ctrl, uint32_t peer, uint64_t *v, int timeout_ms);
int hmc_ctrl_send_int(uint64_t ctrl, uint32_t peer, int32_t v, int timeout_ms);
int hmc_ctrl_recv_int(uint64_t ctrl, uint32_t peer, int32_t *v, int timeout_ms);
/* A POD struct as CTRL_STRUCT; the receive requires exactly n bytes (HMC_ERROR otherwise). */
int hmc_ctrl_send_struct(uint64_t ctrl, uint32_t peer, const void *data, uint64_t n, int timeout_ms);
int hmc_ctrl_recv_struct(uint64_t ctrl, uint32_t peer, void *data, uint64_t n, int timeout_ms);
int hmc_ctrl_close_peer(uint64_t ctrl, uint32_t peer);
int hmc_ctrl_close_all(uint64_t ctrl);
int hmc_ctrl_destroy(uint64_t ctrl);

/* ---- Collectives ---- */

/* Makes a group of n members (ranks 0..n-1; ips/data_ports/ctrl_ports indexed by rank) in which
 * this session has rank; the session must already serve at its own entry. Returns when every
 * member is connected. */
int hmc_group_create(uint64_t session, int n, const char **ips, const int *data_ports,
                     const int *ctrl_ports, uint32_t rank, int conn, int timeout_ms,
                     uint64_t *out_group);
/* All-to-all of block-byte blocks: rank r's block j (send_off + j*block) lands in rank j's
 * buffer at recv_off + r*block. algo: 0 auto (direct up to 8 members, else ring), 1 direct,
 * 2 ring (needs hmc_group_scratch_size bytes at scratch_off in every buffer). */
int hmc_group_alltoall(uint64_t group, int algo, uint64_t send_off, uint64_t recv_off,
                       uint64_t scratch_off, uint64_t block, int timeout_ms);
uint64_t hmc_group_scratch_size(int world, uint64_t block);
int hmc_group_destroy(uint64_t group);

/* ---- Config store and store groups (fabric/store, fabric/group) ----
 * url: "tcp://ip:port" (the embedded store) or "etcd://host:port[,host:port][/namespace]".
 * rank: >= 0 explicit, -1 automatic (lowest free rank below world), -2 none.
 * serve != 0: start the embedded store on url when the address is free (the first process to
 * get there serves; keep its handle open until the job ends), connect either way.
 * Status returns as above: TIMEOUT, NOT_FOUND (absent key), INVALID_CONFIG (bad argument, or a
 * buffer too small: *len / *outlen then says how much is needed), ERROR (store lost, rank taken). */
int hmc_store_open(const char *url, int rank, int world, int timeout_ms, int serve, uint64_t *out);
/* hmc_store_open with the store's protections: a shared secret (secret_len bytes; none when 0)
 * and TLS 1.3 from PEM files: tls_cert and tls_key are this side's certificate and key (mutual
 * TLS, or serving), tls_ca the authority the other side must be signed by. NULL: none. */
int hmc_store_open_secure(const char *url, int rank, int world, int timeout_ms, int serve,
                          const void *secret, uint64_t secret_len, const char *tls_cert,
                          const char *tls_key, const char *tls_ca, uint64_t *out);
int hmc_store_rank(uint64_t store, int *rank, int *serving);
int hmc_store_set(uint64_t store, const char *key, const void *value, uint64_t len, int timeout_ms);
/* wait_ms: 0 = absent is NOT_FOUND at once, > 0 = wait that long for the key, < 0 = until timeout_ms. */
int hmc_store_get(uint64_t store, const char *key, int wait_ms, void *buf, uint64_t cap, uint64_t *len,
                  int timeout_ms);
int hmc_store_add(uint64_t store, const char *key, int64_t delta, int64_t *value, int timeout_ms);
int hmc_store_close(uint64_t store);
/* A static group of ranks 0..size-1 (this store client's rank among them). A member that dies
 * turns a barrier or allgather into ERROR naming its rank (hmc_last_error). */
int hmc_store_group_open(uint64_t store, const char *name, int size, int timeout_ms, uint64_t *out);
int hmc_store_group_barrier(uint64_t group, int timeout_ms);
/* out receives, in rank order, per member: uint32 little-endian length, then the bytes. */
int hmc_store_group_allgather(uint64_t group, const void *data, uint64_t len, void *out, uint64_t cap,
                              uint64_t *outlen, int timeout_ms);
int hmc_store_group_close(uint64_t group);

/* ---- Transfer engine (Go package fabric/trans): one-sided transfers between named peers ----
 * An engine is named by its unique id "ip:port" ("[v6]:port"; port 0 picks one), the address
 * of its request socket. metadata: "tcp://..." (embedded store), "etcd://..." or a bare
 * "host:port" (etcd), "http://host:port/path" (Mooncake's HTTP metadata server), "redis://...",
 * or "P2PHANDSHAKE" / NULL (none). role: 1 sender, 2 receiver (does not initiate), 3 or 0 both.
 * protocols: "shm,tcp" (order of preference; shm only reaches peers on this host), NULL: that;
 * "rdma" alone is Mooncake's: shm and UCX's RDMA (tcp with MC_FORCE_TCP=1).
 * Remote addresses are the peer's own virtual addresses inside memory it registered; anything
 * else is NOT_FOUND (unregistered) or INVALID_CONFIG (past a registered range's end). */
int hmc_trans_create(const char *metadata, const char *unique_id, int role, const char *protocols,
                     int timeout_ms, uint64_t *out);
int hmc_trans_destroy(uint64_t engine);
int hmc_trans_unique_id(uint64_t engine, char *buf, uint64_t cap);
int hmc_trans_register(uint64_t engine, uint64_t addr, uint64_t size);
/* Overlapping and adjacent ranges are coalesced; on error none stays registered. */
int hmc_trans_batch_register(uint64_t engine, const uint64_t *addrs, const uint64_t *sizes, uint64_t n);
int hmc_trans_deregister(uint64_t engine, uint64_t addr, int timeout_ms);
/* Shareable (memfd) host memory, registered; freed by hmc_trans_free or hmc_trans_destroy. */
int hmc_trans_malloc(uint64_t engine, uint64_t size, uint64_t *addr);
int hmc_trans_free(uint64_t engine, uint64_t addr, int timeout_ms);
/* op: 0 read (remote -> local), 1 write. notify_msg (NULL: none) reaches the peer after the
 * transfers completed. hmc_trans_submit returns a batch at once: hmc_trans_status gives
 * Mooncake's TransferStatusEnum (0 waiting, 1 pending, 4 completed, 5 timeout, 6 failed),
 * hmc_trans_wait its error and forgets it. hmc_trans_transfer's timeout_ms grows by 1 ms per MiB
 * of the batch, as Mooncake's; an entry whose range runs past the address space fails it. */
int hmc_trans_transfer(uint64_t engine, const char *peer, int op, const uint64_t *locals,
                       const uint64_t *remotes, const uint64_t *sizes, uint64_t n,
                       const char *notify_msg, int timeout_ms);
int hmc_trans_submit(uint64_t engine, const char *peer, int op, const uint64_t *locals,
                     const uint64_t *remotes, const uint64_t *sizes, uint64_t n,
                     const char *notify_msg, uint64_t *batch);
int hmc_trans_status(uint64_t engine, uint64_t batch, int *status);
int hmc_trans_wait(uint64_t engine, uint64_t batch, int timeout_ms);
/* Checks that peer is published (with metadata) and answers now (Mooncake's send_probe). */
int hmc_trans_probe(uint64_t engine, const char *peer, int timeout_ms);
/* A notification alone (Mooncake's sendNotifyByName). */
int hmc_trans_notify(uint64_t engine, const char *peer, const char *msg, int timeout_ms);
/* The same with the sender's name given (NULL or "": this engine's unique id). */
int hmc_trans_notify_as(uint64_t engine, const char *peer, const char *name, const char *msg, int timeout_ms);
/* JSON about the engine, into buf (cap bytes; *len = its length, or the length needed with
 * INVALID_CONFIG): what 0 = notifications received since the last call [{"name","msg"}],
 * 1 = the peer's registered buffers [{"Addr","Size"}], 2 = this engine's. */
int hmc_trans_json(uint64_t engine, int what, const char *peer, char *buf, uint64_t cap, uint64_t *len,
                   int timeout_ms);

/* ---- KV-cache pool (fabric/kv; Mooncake Store's model). Calls return Mooncake Store's error
 * codes (0, or negative), or a size or count where that is the result; hmc_last_error says why. */

int32_t hmc_kv_master_start(const char *addr, int lease_ms, int client_ttl_ms, char *addr_buf, uint64_t addr_len,
                            uint64_t *out_master);
int32_t hmc_kv_master_stop(uint64_t master);
/* protocol: Mooncake's ("tcp", "rdma": UCX's RDMA, "ucx"; NULL: tcp); peers on one host use
 * shared memory whatever it is. */
int32_t hmc_kv_client_create(const char *master, const char *local_hostname, const char *metadata,
                             const char *protocol, uint64_t segment_size, uint64_t *out_client);
int32_t hmc_kv_client_id(uint64_t client, char *buf, uint64_t len);
int32_t hmc_kv_put(uint64_t client, const char *key, const void *value, uint64_t len, int replicas);
int64_t hmc_kv_get_size(uint64_t client, const char *key);
int64_t hmc_kv_get_into(uint64_t client, const char *key, void *dst, uint64_t len);
int32_t hmc_kv_exist(uint64_t client, const char *key);
/* force != 0 removes leased objects too (Mooncake's force). */
int32_t hmc_kv_remove(uint64_t client, const char *key, int force);
int64_t hmc_kv_remove_regex(uint64_t client, const char *pattern, int force); /* NULL: every object */
int32_t hmc_kv_ping(uint64_t client); /* 0 when the master answers */
/* The object in memory the library mallocs (one call to the master); free it with hmc_kv_free. */
int32_t hmc_kv_get(uint64_t client, const char *key, void **out, uint64_t *len);
void hmc_kv_free(void *p);
/* One more segment lent to the pool ("" or "cpu", "cuda:N", "hip:N"); its name into buf. */
int32_t hmc_kv_mount_segment(uint64_t client, uint64_t size, const char *location, char *buf, uint64_t len);
int32_t hmc_kv_unmount_segment(uint64_t client, const char *name, int64_t grace_ms);
int32_t hmc_kv_register_buffer(uint64_t client, uint64_t addr, uint64_t size);
int32_t hmc_kv_unregister_buffer(uint64_t client, uint64_t addr);
/* Batches: n keys NUL-terminated one after another in the keys_size bytes at keys; object i is
 * gathered from (put) or scattered over (get) counts[i] parts (counts NULL: one each) taken in
 * order from addrs and sizes (host or device memory). out[i] is each key's code (put, exist:
 * 1/0, remove) or size (get; negative: its code). They return 0, or a negative code when the
 * batch could not start. upsert != 0 rewrites keys that exist. */
int32_t hmc_kv_batch_put(uint64_t client, uint64_t n, const char *keys, uint64_t keys_size, const uint32_t *counts,
                         const uint64_t *addrs, const uint64_t *sizes, int replicas, int upsert, int32_t *out);
int32_t hmc_kv_batch_get(uint64_t client, uint64_t n, const char *keys, uint64_t keys_size, const uint32_t *counts,
                         const uint64_t *addrs, const uint64_t *sizes, int64_t *out);
int32_t hmc_kv_batch_exist(uint64_t client, uint64_t n, const char *keys, uint64_t keys_size, int32_t *out);
int32_t hmc_kv_batch_remove(uint64_t client, uint64_t n, const char *keys, uint64_t keys_size, int force,
                            int32_t *out);
int32_t hmc_kv_client_close(uint64_t client);

/* For the Python package (python/hmc/_lib.py), not for C callers: the first nlists (1-3) of
 * CPython lists a, b, c (n ints each) as uint64_t into out, one after another, in one pass,
 * called with the GIL held; list_type and int_type are id(list) and id(int), layout 1 for
 * CPython up to 3.11, 2 for 3.12-3.14. Returns n, or -1 where a list is not a list of n plain
 * ints in 0..2^64-1. */
int64_t hmc_py_u64s(int nlists, const void *a, const void *b, const void *c, const void *list_type,
                    const void *int_type, int layout, uint64_t *out, int64_t n);

/* For the Python package too: hmc_trans_transfer of a batch given as three CPython lists of n
 * plain ints (hmc_py_trans_transfer) or three one-dimensional NumPy uint64 arrays
 * (hmc_py_trans_arrays), called with the GIL held; each reads its arguments and releases the
 * GIL while the batch runs. They return hmc_trans_transfer's status, or -1 (the GIL untouched)
 * where they do not take their arguments whole. hmc_py_setup gives them the interpreter's list
 * and int types, layout (as hmc_py_u64s) and PyEval_SaveThread and PyEval_RestoreThread;
 * hmc_py_setup_numpy NumPy's ndarray type and uint64 dtype. hmc_py_array_data is the memory of
 * such an array of n entries, or NULL. */
int hmc_py_setup(const void *list_type, const void *int_type, int layout, void *save, void *restore);
int hmc_py_trans_transfer(uint64_t engine, const char *peer, int op, const void *a, const void *b, const void *c,
                          int64_t n, int timeout_ms);
int hmc_py_setup_numpy(const void *ndarray_type, const void *u64_dtype);
const uint64_t *hmc_py_array_data(const void *o, int64_t n);
int hmc_py_trans_arrays(uint64_t engine, const char *peer, int op, const void *a, const void *b, const void *c,
                        int64_t n, int timeout_ms);

#ifdef __cplusplus
}
#endif
#endif /* HMC_GO_H */
