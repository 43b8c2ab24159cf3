package transport

import (
	"context"
	"fmt"
	"strings"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

// ConnType names a transport. RDMA and UCX keep upstream HMC's values; TCP, SHM and AUTO are
// HMC-Go's additions.
type ConnType int

// The connection types.
const (
	RDMA ConnType = 0 // RDMA verbs (through UCX restricted to rc/ud/dc)
	UCX  ConnType = 1 // UCX (libucp)
	TCP  ConnType = 2 // multi-lane TCP, pure Go
	SHM  ConnType = 3 // same-host shared memory
	AUTO ConnType = 4 // SHM for same-host peers, else UCX/RDMA when usable, else TCP
)

var connNames = [...]string{RDMA: "rdma", UCX: "ucx", TCP: "tcp", SHM: "shm", AUTO: "auto"}

// String returns the lower-case name (rdma, ucx, tcp, shm, auto).
func (c ConnType) String() string {
	if c >= 0 && int(c) < len(connNames) {
		return connNames[c]
	}
	return fmt.Sprintf("ConnType(%d)", int(c))
}

// ParseConnType accepts the names printed by String, case-insensitively.
func ParseConnType(s string) (ConnType, error) {
	l := strings.ToLower(strings.TrimSpace(s))
	for i, n := range connNames {
		if n == l {
			return ConnType(i), nil
		}
	}
	return 0, fmt.Errorf("connection type %q (want rdma, ucx, tcp, shm or auto): %w", s, status.ErrInvalidConfig)
}

// PeerInfo is what a target learns about an initiator from its handshake.
type PeerInfo struct {
	Rank       uint32 // the initiator's rank
	IP         string // the initiator's address as seen by the target
	ListenPort int    // the initiator's own data listen port for this transport, 0 if none
}

// ServerConfig configures the target side of a transport.
type ServerConfig struct {
	// BindAddr is "host:port" to listen on; port 0 picks a free one.
	BindAddr string
	// Region is the registered buffer that peers may put into and get from. Requests are
	// bounds-checked against it before a byte moves.
	Region *buffer.ConnBuffer
	// Rank is this process's rank, told to initiators.
	Rank uint32
	// OnAccept, if set, is called once per initiator endpoint, from a server goroutine.
	OnAccept func(PeerInfo)
	// Regions, if set, is the process's region table: the server also serves every region
	// registered in it (and registered later), which initiators name by key or by address
	// through RMA. Requests are looked up and bounds-checked before a byte moves.
	Regions *buffer.Table
	// OnWrite, if set, is called after a peer's PUT of n bytes at off has landed in the region
	// (before the initiator is told), from the goroutine serving it. It must not block: it is
	// the target's write notification (RDMA's write-with-immediate), for applications that wait
	// for data instead of polling their buffer.
	OnWrite func(off, n uint64)
}

// DialConfig configures the initiator side of one endpoint.
type DialConfig struct {
	// Addr is the target's data address, "host:port".
	Addr string
	// Local is the initiator's registered buffer: local offsets refer to it.
	Local *buffer.ConnBuffer
	// Rank is the initiator's rank and ListenPort its own data listen port (0 if none), sent to
	// the target so it can address the initiator back.
	Rank       uint32
	ListenPort int
	// LocalIP is the initiator's own address as its peers know it ("" if unknown). Transports
	// whose target cannot see it (shared memory) pass it on in their handshake.
	LocalIP string
	// Lanes is the number of parallel connections (HMC's num_chs); 0 means the transport's
	// default.
	Lanes int
}

// Transport creates servers and endpoints of one ConnType.
type Transport interface {
	// Type returns the ConnType this transport implements.
	Type() ConnType
	// Listen starts serving cfg.Region to peers. Bind errors are returned, never logged.
	Listen(cfg ServerConfig) (Server, error)
	// Dial connects to a target and returns an endpoint for one-sided transfers.
	Dial(ctx context.Context, cfg DialConfig) (Endpoint, error)
}

// Progresser is implemented by transports whose one-sided operations need the target's
// software to progress (UCX over tcp, or emulating RMA over shared memory). A process polling
// its own memory for a peer's put calls Progress in the loop, as a UCX program calls
// ucp_worker_progress; a background goroutine progresses otherwise, but it stands aside while
// someone polls and may come back up to a millisecond late.
type Progresser interface {
	Progress()
}

// Server is the target side: it serves requests against its region without the application's
// involvement.
type Server interface {
	// Addr returns the address peers dial ("host:port").
	Addr() string
	// Close stops accepting, closes every served connection and waits for its goroutines.
	Close() error
}

// Endpoint is the initiator's handle on one peer's region. Its methods are safe for concurrent
// use; transfers on one endpoint may complete in any order.
type Endpoint interface {
	// PutAsync starts copying local[localOff, +n) to remote[remoteOff, +n). Both ranges are
	// checked first (ErrOutOfRange, nothing moves). ctx bounds only the posting (which may wait
	// for an in-flight slot); the returned Op completes when the bytes are visible in the
	// target's region, or with an error.
	PutAsync(ctx context.Context, localOff, remoteOff, n uint64) (*Op, error)
	// GetAsync starts copying remote[remoteOff, +n) to local[localOff, +n); the Op completes
	// when the bytes are in the local region.
	GetAsync(ctx context.Context, localOff, remoteOff, n uint64) (*Op, error)
	// RemoteSize returns the size of the target's region, as it declared at connect.
	RemoteSize() uint64
	// Close fails every transfer in flight with ErrClosed and releases the endpoint. It is
	// idempotent and waits for the endpoint's goroutines.
	Close() error
}

// DefaultRegion is the Remote key that names the region a server was started with
// (ServerConfig.Region), which Endpoint's offsets address.
const DefaultRegion buffer.Key = 1<<32 - 1

// Remote names bytes of a peer's registered memory.
type Remote struct {
	// Key is the region's key in its owner's table, with Addr an offset in it; DefaultRegion
	// names the server's own region. Key 0 means Addr is an address in the owner's memory,
	// looked up in its table (the transfer engine and Big Memory address that way).
	Key  buffer.Key
	Addr uint64
}

// At returns r moved off bytes further.
func (r Remote) At(off uint64) Remote { return Remote{Key: r.Key, Addr: r.Addr + off} }

// RMA is implemented by endpoints that reach every region their peer registered (not only the
// one it was dialled for). A transfer must lie within one region of the target, checked there;
// an unknown or deregistered region is ErrNotFound, a range past its end ErrOutOfRange.
type RMA interface {
	// WriteAsync starts copying src to dst; the Op completes when the bytes are visible in the
	// target's memory. src must stay valid and unchanged until then.
	WriteAsync(ctx context.Context, src []byte, dst Remote) (*Op, error)
	// ReadAsync starts copying len(dst) bytes at src into dst; the Op completes when they are
	// there. dst must stay valid and must not be read until then.
	ReadAsync(ctx context.Context, dst []byte, src Remote) (*Op, error)
	// Atomic runs op on the aligned 64-bit word at dst, atomically with respect to every other
	// atomic on that word (from any peer, and the owner's own sync/atomic use), and returns the
	// word's previous value.
	Atomic(ctx context.Context, op buffer.AtomicOp, dst Remote, operand, compare uint64) (uint64, error)
}

// Put is a blocking PutAsync: it returns when the bytes are visible at the target or ctx ends.
// If ctx ends first, the target range is left unspecified (some, all or none of the bytes
// arrived); bytes outside it are never touched.
func Put(ctx context.Context, ep Endpoint, localOff, remoteOff, n uint64) error {
	op, err := ep.PutAsync(ctx, localOff, remoteOff, n)
	if err != nil {
		return err
	}
	return op.Wait(ctx)
}

// Get is a blocking GetAsync, with Put's cancellation rules for the local range.
func Get(ctx context.Context, ep Endpoint, localOff, remoteOff, n uint64) error {
	op, err := ep.GetAsync(ctx, localOff, remoteOff, n)
	if err != nil {
		return err
	}
	return op.Wait(ctx)
}

// CheckRanges validates a transfer's local and remote ranges. Every transport calls it before
// posting; targets check the remote range again on their side.
func CheckRanges(localSize, remoteSize, localOff, remoteOff, n uint64) error {
	if err := buffer.CheckRange(localSize, localOff, n); err != nil {
		return fmt.Errorf("local: %w", err)
	}
	if err := buffer.CheckRange(remoteSize, remoteOff, n); err != nil {
		return fmt.Errorf("remote: %w", err)
	}
	return nil
}

// VectorRMA is implemented by endpoints that move many pieces in one message (a KV cache's
// scattered blocks): one header, one table and one completion for many small transfers,
// instead of a request, a wake-up and an acknowledgement each.
type VectorRMA interface {
	// WriteVAsync copies srcs[i] to dsts[i] for every i; the Op completes when every piece is
	// visible at the target, or with the first error (which pieces landed is then unspecified,
	// as for a failed WriteAsync). The bytes of srcs must stay unchanged until then; the lists
	// srcs and dsts themselves are the caller's again once the call returns (an
	// implementation copies what it keeps), so a caller may reuse them for its next vector.
	WriteVAsync(ctx context.Context, srcs [][]byte, dsts []Remote) (*Op, error)
	// ReadVAsync copies the bytes at srcs[i] into dsts[i] for every i.
	ReadVAsync(ctx context.Context, dsts [][]byte, srcs []Remote) (*Op, error)
}

// DeviceRMA is implemented by endpoints that move this process's device memory themselves
// (the same-host transport: one device copy into the target's mapping or, through IPC, its
// device memory). Endpoints without it take device memory through a host staging ring
// (StagedWrite, StagedRead).
type DeviceRMA interface {
	// WriteFromDeviceAsync is RMA's WriteAsync from n bytes of device memory at src (at pl).
	WriteFromDeviceAsync(ctx context.Context, src memory.Ptr, pl memory.Place, n uint64, dst Remote) (*Op, error)
	// ReadToDeviceAsync is RMA's ReadAsync into n bytes of device memory at dst (at pl).
	ReadToDeviceAsync(ctx context.Context, dst memory.Ptr, pl memory.Place, n uint64, src Remote) (*Op, error)
}

// SharedRegion is a peer's registered region handed over as its memory descriptor: mapping
// FD from FDOffset gives the Size bytes that the peer has at Addr.
type SharedRegion struct {
	FD         int // a duplicate the caller owns and closes
	FDOffset   uint64
	Addr, Size uint64
}

// RegionSharer is implemented by endpoints that can hand over a peer's region itself (the
// same-host transport passes its memfd), so the caller maps it where it likes: the fabric
// layer maps co-located peers' slices at their global addresses, for plain loads and stores.
// A region without a memfd is ErrUnsupported. Operations through such a mapping are not
// fenced by the owner's Deregister: use it for memory that lives as long as the mapping's use.
type RegionSharer interface {
	ShareRegion(ctx context.Context, r Remote, n uint64) (SharedRegion, error)
}
