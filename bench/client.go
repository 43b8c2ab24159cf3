package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hmc-go/hmc/auth"
	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/comm"
	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/shm"
	"github.com/hmc-go/hmc/transport/stack"
	"github.com/hmc-go/hmc/transport/tcp"
	"github.com/hmc-go/hmc/transport/ucx"
)

// Modes of upstream's uhm_app, reproduced over any transport.
const (
	ModeNone    = ""         // plain buffer-to-buffer op (put, get or lat)
	ModeUHM     = "uhm"      // SendDataTo from the source memory: staging overlapped with transfer
	ModeRDMACPU = "rdma_cpu" // stage untimed, time the put only ("network only")
	ModeG2H2G   = "g2h2g"    // copy the whole source into the host buffer, then put; both timed
	ModeSerial  = "serial"   // per half-buffer chunk: copy, then put, no overlap; timed
)

// Config configures a benchmark client.
type Config struct {
	PeerIP    string
	DataPort  int
	CtrlPort  int
	Transport transport.ConnType
	Op        string   // put, get, lat (blocking put round trips) or pingpong (ucp_put_lat's half round trip)
	Mode      string   // one of the Mode constants
	Sizes     []uint64 // bytes per transfer
	Iters     int      // iterations per size; 0: derived from Duration or a byte budget
	Duration  time.Duration
	Warmup    int
	Lanes     int
	Chunk     uint64        // the transport's chunk size (0: its default)
	BusyPoll  time.Duration // spin on reads before parking (tcp.Config.BusyPoll)
	// SHMWorkers is the copy goroutines of a shared-memory endpoint (shm.Config.Workers; 0:
	// GOMAXPROCS, at most 8; 1: the caller alone).
	SHMWorkers int
	// UCXSpin is how long UCX's progress loop and waits busy-poll, in µs (ucx.Config.SpinTime;
	// 0: its default).
	UCXSpin int
	Window  int         // transfers kept in flight for put/get, a sliding window (1: blocking)
	Mem     memory.Type // where the source lives: CPU or a device type
	// BufferMem is where the client's registered buffer lives (default CPU). A device type
	// measures plain puts and gets of a GPU ConnBuffer: the transport moves device memory itself
	// (UCX with CUDA support) or stages it through its pinned ring, overlapping copies and I/O.
	BufferMem memory.Type
	// UCXAlloc makes UCX allocate both host ConnBuffers when Transport is UCX
	// (ucx.NewHostBuffer), as ucx_perftest does: UCX's shared-memory transports then write
	// straight into the target's. The server must be started with the same setting.
	UCXAlloc bool
	Verify   bool // checksum every transfer at the target (untimed)
	// Notify makes the ping-pong wait for the peer's answer through the transport's write
	// notification (comm.Config.OnRemoteWrite; TCP only) instead of polling its own memory,
	// which is what ucx_perftest's ucp_put_lat does and the default.
	Notify bool
	// Auth authenticates every link with the server (comm.Config.Auth); zero: none.
	Auth auth.Config
	// Observer, if set, is told of every blocking operation (comm.Config.Observer): the CLI's
	// --metrics counts them for Prometheus.
	Observer comm.Observer
	// Progress, if set, is called after every timed iteration.
	Progress func(size uint64, iter, iters int)
}

// Result is one size's measurement.
type Result struct {
	Transport string  `json:"transport"`
	Route     string  `json:"route"` // the transport that carried the data (AUTO's choice)
	Op        string  `json:"op"`
	Mode      string  `json:"mode,omitempty"`
	Mem       string  `json:"mem"`
	BufferMem string  `json:"buffer_mem"`
	Size      uint64  `json:"size"`
	Iters     int     `json:"iters"`
	GBps      float64 `json:"gbps"` // 10^9 bytes per second over the timed wall clock
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
	MeanUs    float64 `json:"mean_us"`
	Lanes     int     `json:"lanes"`
	Threads   int     `json:"threads,omitempty"` // hmc trans bench: batches in flight, one goroutine each
	Window    int     `json:"window"`
	Verified  bool    `json:"verified"`
	// The transfer engine's rows (hmc trans bench): the median batch's time over its blocks, and
	// the same bytes per batch as one contiguous transfer in the same run, with the ratio.
	BlockUs  float64 `json:"block_us,omitempty"`
	PeerGBps float64 `json:"contiguous_gbps,omitempty"`
	Ratio    float64 `json:"ratio,omitempty"`
	// Unsteady says why the run is too short to be steady (empty when it is not): a timed
	// total under MinSteady, or early steps much slower than later ones (ramp-up).
	Unsteady string `json:"unsteady,omitempty"`
}

// MinSteady is the shortest timed run Result.Unsteady accepts as steady.
const MinSteady = 500 * time.Millisecond

// unsteady says why lat (the timed steps, in order) is not a steady run, or "".
func unsteady(lat []time.Duration, total time.Duration) string {
	if total < MinSteady {
		return fmt.Sprintf("timed %v in all, under %v: use --duration 3s", total.Round(time.Millisecond), MinSteady)
	}
	if len(lat) < 20 {
		return fmt.Sprintf("%d steps: use --duration 3s", len(lat))
	}
	mean := func(d []time.Duration) float64 {
		var t time.Duration
		for _, x := range d {
			t += x
		}
		return float64(t) / float64(len(d))
	}
	first, second := mean(lat[:len(lat)/10]), mean(lat[len(lat)/2:])
	if second > 0 && first > 1.25*second {
		return fmt.Sprintf("the first tenth of the steps took %.0f%% longer than the second half (ramp-up): use --duration 3s or more --warmup", 100*(first/second-1))
	}
	return ""
}

// Validate checks the configuration before anything starts: the op and mode, counts that
// cannot be negative, the memory types being usable here, and the largest transfer fitting in
// this machine's available memory. Errors name the CLI flag to change.
func (cfg Config) Validate() error {
	c := cfg
	if err := c.validate(); err != nil {
		return err
	}
	switch {
	case cfg.Iters < 0:
		return fmt.Errorf("bench: --iters %d: want 0 (automatic) or more: %w", cfg.Iters, status.ErrInvalidConfig)
	case cfg.Duration < 0:
		return fmt.Errorf("bench: --duration %v: want 0 (use --iters) or more: %w", cfg.Duration, status.ErrInvalidConfig)
	case cfg.Warmup < 0:
		return fmt.Errorf("bench: --warmup %d: want 0 or more: %w", cfg.Warmup, status.ErrInvalidConfig)
	case cfg.Window < 0:
		return fmt.Errorf("bench: --window %d: want 1 (blocking) or more: %w", cfg.Window, status.ErrInvalidConfig)
	case cfg.Lanes < 0 || cfg.Lanes > 64:
		return fmt.Errorf("bench: --lanes %d: want 0 (the transport's default) to 64: %w", cfg.Lanes, status.ErrInvalidConfig)
	}
	for _, m := range []struct {
		flag string
		t    memory.Type
	}{{"--mem", c.Mem}, {"--buffer-mem", c.BufferMem}} {
		if m.t != memory.CPU {
			if err := memory.Probe(m.t); err != nil {
				return fmt.Errorf("bench: %s %v: %w", m.flag, m.t, err)
			}
		}
	}
	largest := slices.Max(cfg.Sizes)
	// Both sides hold a buffer of the largest transfer, and the client its source data.
	if avail, ok := memAvailable(); ok && c.BufferMem == memory.CPU && largest > avail/3 {
		return fmt.Errorf("bench: --sizes: the largest transfer, %s, needs about %s of host memory (a buffer on each side and the source), and %s is available: %w",
			FormatSize(largest), FormatSize(3*largest), approxSize(avail), status.ErrInvalidConfig)
	}
	return nil
}

// approxSize prints n in GiB or MiB with one decimal.
func approxSize(n uint64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.1fGiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
}

// memAvailable returns the kernel's estimate of the memory available to new allocations
// (MemAvailable in /proc/meminfo), or false when it cannot be read.
func memAvailable() (uint64, bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

func (cfg *Config) validate() error {
	switch cfg.Op {
	case "put", "get", "lat", "pingpong":
	default:
		return fmt.Errorf("bench: op %q (want put, get, lat or pingpong): %w", cfg.Op, status.ErrInvalidConfig)
	}
	switch cfg.Mode {
	case ModeNone, ModeUHM, ModeRDMACPU, ModeG2H2G, ModeSerial:
	default:
		return fmt.Errorf("bench: mode %q (want uhm, rdma_cpu, g2h2g or serial): %w", cfg.Mode, status.ErrInvalidConfig)
	}
	if cfg.Mode != ModeNone && cfg.Op != "put" {
		return fmt.Errorf("bench: mode %s measures puts; use --op put: %w", cfg.Mode, status.ErrInvalidConfig)
	}
	if len(cfg.Sizes) == 0 {
		return fmt.Errorf("bench: no sizes: %w", status.ErrInvalidConfig)
	}
	if cfg.Op == "pingpong" && cfg.Mode != ModeNone {
		return fmt.Errorf("bench: pingpong takes no mode: %w", status.ErrInvalidConfig)
	}
	if cfg.Window <= 0 || cfg.Op == "lat" || cfg.Op == "pingpong" || cfg.Mode != ModeNone {
		cfg.Window = 1
	}
	if cfg.Mem == memory.Default {
		cfg.Mem = memory.CPU
	}
	if cfg.BufferMem == memory.Default {
		cfg.BufferMem = memory.CPU
	}
	if cfg.BufferMem != memory.CPU && (cfg.Mode != ModeNone || (cfg.Op != "put" && cfg.Op != "get")) {
		return fmt.Errorf("bench: a %v buffer is measured with plain put or get (no mode): %w", cfg.BufferMem, status.ErrInvalidConfig)
	}
	return nil
}

func (cfg *Config) iters(size uint64) int {
	if cfg.Iters > 0 {
		return cfg.Iters
	}
	if cfg.Duration > 0 {
		return 0 // decided by the clock
	}
	n := int((1 << 30) / size) // about 1 GiB per size
	return min(max(n, 20), 20000)
}

// Run connects to a benchmark server and measures every size; onResult gets each result as
// soon as it is ready.
func Run(ctx context.Context, cfg Config, onResult func(Result)) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	maxSize := slices.Max(cfg.Sizes)
	buf, err := newBuffer(max(maxSize, 1<<20), cfg.BufferMem, cfg.Transport, cfg.UCXAlloc)
	if err != nil {
		return err
	}
	defer buf.Close()
	arr := newArrivals()
	reg, err := stack.New(stack.Config{TCP: tcp.Config{ChunkSize: cfg.Chunk, BusyPoll: cfg.BusyPoll}, SHM: shm.Config{Workers: cfg.SHMWorkers},
		UCX: ucx.Config{SpinTime: cfg.UCXSpin}, Auth: cfg.Auth})
	if err != nil {
		return err
	}
	c, err := comm.New(buf, comm.Config{NumChannels: cfg.Lanes, Transports: reg,
		OnRemoteWrite: arr.notify, Observer: cfg.Observer, Auth: cfg.Auth,
		Stream: comm.StreamConfig{SlotSize: min(4<<20, max(maxSize/4, 64<<10), buf.Size()/2)}})
	if err != nil {
		return err
	}
	defer c.Close()
	if cfg.Op == "pingpong" {
		// The server puts back into our buffer: it dials our data server on first use.
		if err := c.InitServer(localIPFor(cfg.PeerIP), 0, -1, "", cfg.Transport); err != nil {
			return err
		}
	}
	link := comm.CtrlLink{Transport: ctrl.TCP, IP: cfg.PeerIP, Port: cfg.CtrlPort}
	if err := c.ConnectTo(ctx, serverRank, clientRank, cfg.PeerIP, cfg.DataPort, link, cfg.Transport); err != nil {
		return err
	}
	src, err := newSource(cfg.Mem, maxSize)
	if err != nil {
		return err
	}
	defer src.close()
	route, err := c.Peer(cfg.PeerIP, cfg.DataPort, cfg.Transport).Route()
	if err != nil {
		return err
	}
	r := &runner{cfg: cfg, c: c, buf: buf, src: src, ctx: ctx, arr: arr, epoch: time.Now()}
	for _, size := range cfg.Sizes {
		measure := r.measure
		if cfg.Op == "pingpong" {
			measure = r.pingpong
		}
		res, err := measure(size)
		if err != nil {
			return fmt.Errorf("bench: size %s: %w", FormatSize(size), err)
		}
		res.Route = route.String()
		onResult(res)
	}
	_ = c.CtrlSend(ctx, serverRank, cmdExit) // the server also stops when we hang up
	return nil
}

// newBuffer allocates a ConnBuffer of t memory for transport ct: host memory that UCX
// allocated if ucxAlloc and ct is UCX.
func newBuffer(size uint64, t memory.Type, ct transport.ConnType, ucxAlloc bool) (*buffer.ConnBuffer, error) {
	if ucxAlloc && ct == transport.UCX && t == memory.CPU {
		return ucx.NewHostBuffer(size, ucx.Config{}) // the Config comm.New gets
	}
	return buffer.New(0, size, t)
}

// source is the payload's home: host bytes, or device memory filled from host bytes.
type source struct {
	typ  memory.Type
	host []byte
	mem  *memory.Memory
	dev  *memory.Buffer
}

func newSource(t memory.Type, size uint64) (*source, error) {
	s := &source{typ: t, host: make([]byte, size)}
	for i := range s.host {
		s.host[i] = byte(i*131 + i>>8)
	}
	if t == memory.CPU {
		return s, nil
	}
	m, err := memory.New(0, t)
	if err != nil {
		return nil, err
	}
	s.mem = m
	if s.dev, err = m.Alloc(size); err != nil {
		_ = m.Close()
		return nil, err
	}
	return s, s.sync(size)
}

// stamp makes iteration i's payload distinct (for --verify) and returns it.
func (s *source) stamp(i int, size uint64) error {
	if size >= 8 {
		binary.LittleEndian.PutUint64(s.host, uint64(i)+1)
	} else {
		s.host[0] = byte(i + 1)
	}
	if s.mem != nil {
		return s.mem.CopyHostToDevice(s.dev.Ptr(), s.host[:min(size, 8)])
	}
	return nil
}

func (s *source) sync(size uint64) error {
	if s.mem == nil {
		return nil
	}
	return s.mem.CopyHostToDevice(s.dev.Ptr(), s.host[:size])
}

func (s *source) data(size uint64) comm.Data {
	if s.mem == nil {
		return comm.HostData(s.host[:size])
	}
	return comm.DeviceData(s.dev.Ptr(), size, s.typ, 0)
}

// stageInto copies source[a, +n) into the buffer at off. A device buffer (plain ops only, whose
// staging is untimed) is filled from the host copy, which mirrors the device source.
func (s *source) stageInto(buf *buffer.ConnBuffer, a, n, off uint64) error {
	if s.mem == nil || buf.Bytes() == nil {
		return buf.WriteFromCPU(s.host[a:a+n], off)
	}
	dst, err := buf.Slice(off, n)
	if err != nil {
		return err
	}
	return s.mem.CopyDeviceToHost(dst, s.dev.Ptr()+memory.Ptr(a))
}

func (s *source) close() {
	if s.mem != nil {
		_ = s.mem.Close()
	}
}

type runner struct {
	cfg Config
	c   *comm.Communicator
	buf *buffer.ConnBuffer
	src *source
	ctx context.Context
	arr arrivals

	inflight []uint64      // a sliding window's transfers, oldest first
	epoch    time.Time     // the start of the run, for monotonic time stamps
	mark     time.Duration // since epoch: where the last plain step ended, where the next starts
}

// drain waits for every transfer of the window and returns how long that took.
func (r *runner) drain() (time.Duration, error) {
	start := time.Now()
	err := r.c.Wait(r.ctx, r.inflight...)
	r.inflight = r.inflight[:0]
	return time.Since(start), err
}

func (r *runner) measure(size uint64) (Result, error) {
	cfg := r.cfg
	if err := r.src.sync(size); err != nil {
		return Result{}, err
	}
	if cfg.Mode == ModeNone || cfg.Mode == ModeRDMACPU {
		if err := r.src.stageInto(r.buf, 0, size, 0); err != nil {
			return Result{}, err
		}
	}
	if cfg.Op == "get" {
		// The target's region must hold the source for gets to fetch (and --verify to check).
		if err := r.c.Peer(cfg.PeerIP, cfg.DataPort, cfg.Transport).Put(r.ctx, 0, 0, size); err != nil {
			return Result{}, err
		}
	}
	for i := range cfg.Warmup {
		if _, err := r.once(size, i); err != nil {
			return Result{}, err
		}
	}
	if _, err := r.drain(); err != nil {
		return Result{}, err
	}
	iters := cfg.iters(size)
	lat := make([]time.Duration, 0, max(iters, 1024))
	start := time.Now()
	r.mark = time.Since(r.epoch)
	for i := 0; iters == 0 || i < iters; i++ {
		if iters == 0 && time.Since(start) >= cfg.Duration && i > 0 {
			break
		}
		if cfg.Verify && cfg.Op != "get" {
			if err := r.src.stamp(i, size); err != nil {
				return Result{}, err
			}
			if cfg.Mode == ModeNone || cfg.Mode == ModeRDMACPU {
				if err := r.src.stageInto(r.buf, 0, min(size, 8), 0); err != nil {
					return Result{}, err
				}
			}
		}
		if cfg.Verify || cfg.Progress != nil {
			r.mark = time.Since(r.epoch) // what ran since the last step is not timed
		}
		d, err := r.once(size, i)
		if err != nil {
			return Result{}, err
		}
		if cfg.Verify { // every transfer checked: the window drains first
			dd, err := r.drain()
			if err != nil {
				return Result{}, err
			}
			d += dd
		}
		lat = append(lat, d)
		if cfg.Verify {
			if err := r.verify(size); err != nil {
				return Result{}, fmt.Errorf("iteration %d: %w", i, err)
			}
		}
		if cfg.Progress != nil {
			cfg.Progress(size, i+1, iters)
		}
	}
	if d, err := r.drain(); err != nil { // the window's tail belongs to the last sample
		return Result{}, err
	} else if len(lat) > 0 {
		lat[len(lat)-1] += d
	}
	return summarize(cfg, size, lat), nil
}

// once performs one timed transfer of size bytes and returns its duration. With a window above
// 1 it posts one transfer and, when Window are in flight, waits for the oldest: the sample is
// the time of one step of a sliding window (a stream), as ucx_perftest's bandwidth tests.
func (r *runner) once(size uint64, iter int) (time.Duration, error) {
	cfg, ctx, c := r.cfg, r.ctx, r.c
	ip, port, ct := cfg.PeerIP, cfg.DataPort, cfg.Transport
	switch cfg.Mode {
	case ModeUHM:
		if err := c.CtrlSend(ctx, serverRank, cmdRecv); err != nil {
			return 0, err
		}
		// Port 0: the server knows us as the only initiator from our IP.
		if err := c.Ctrl().SendStruct(ctx, serverRank, command{Len: size, Mem: uint32(cfg.Mem)}); err != nil {
			return 0, err
		}
		start := time.Now()
		if err := c.Peer(ip, port, ct).SendDataTo(ctx, r.src.data(size)); err != nil {
			return 0, err
		}
		d := time.Since(start)
		crc, err := c.CtrlRecv(ctx, serverRank) // the server's checksum of what it received
		if err != nil {
			return 0, err
		}
		if cfg.Verify && uint32(crc) != crc32.ChecksumIEEE(r.src.host[:size]) {
			return 0, fmt.Errorf("stream checksum mismatch: %w", status.ErrFailed)
		}
		return d, nil
	case ModeG2H2G:
		start := time.Now()
		if err := r.src.stageInto(r.buf, 0, size, 0); err != nil {
			return 0, err
		}
		err := c.Peer(ip, port, ct).Put(ctx, 0, 0, size)
		return time.Since(start), err
	case ModeSerial:
		chunk := max(r.buf.Size()/2, 1)
		start := time.Now()
		for off := uint64(0); off < size; off += chunk {
			n := min(chunk, size-off)
			if err := r.src.stageInto(r.buf, off, n, off%r.buf.Size()); err != nil {
				return 0, err
			}
			if err := c.Peer(ip, port, ct).Put(ctx, off%r.buf.Size(), off, n); err != nil {
				return 0, err
			}
		}
		return time.Since(start), nil
	}
	start := r.mark // where the previous step ended: one clock read per step
	var err error
	switch {
	case cfg.Window > 1:
		var id uint64
		if cfg.Op == "get" {
			id, err = c.Peer(ip, port, ct).GetNB(ctx, 0, 0, size)
		} else {
			id, err = c.Peer(ip, port, ct).PutNB(ctx, 0, 0, size)
		}
		if err != nil {
			return 0, err
		}
		r.inflight = append(r.inflight, id)
		if len(r.inflight) >= cfg.Window {
			err = c.Wait(ctx, r.inflight[0])
			r.inflight = r.inflight[:copy(r.inflight, r.inflight[1:])] // in place: no allocation
		}
	case cfg.Op == "get":
		err = c.Peer(ip, port, ct).Get(ctx, 0, 0, size)
	default:
		err = c.Peer(ip, port, ct).Put(ctx, 0, 0, size)
	}
	r.mark = time.Since(r.epoch) // monotonic clock only: half the cost of time.Now on a VM
	return r.mark - start, err
}

func (r *runner) verify(size uint64) error {
	if r.cfg.Mode == ModeUHM {
		return nil // checked in once
	}
	want := crc32.ChecksumIEEE(r.src.host[:size])
	if r.cfg.Op == "get" {
		b, err := r.buf.Slice(0, size)
		if r.buf.Bytes() == nil { // a device buffer: checked through a host copy
			b = make([]byte, size)
			err = r.buf.ReadToCPU(b, 0)
		}
		if err != nil {
			return err
		}
		if crc32.ChecksumIEEE(b) != want {
			return fmt.Errorf("get checksum mismatch: %w", status.ErrFailed)
		}
		return nil
	}
	if err := r.c.CtrlSend(r.ctx, serverRank, cmdVerify); err != nil {
		return err
	}
	if err := r.c.Ctrl().SendStruct(r.ctx, serverRank, command{Len: size}); err != nil {
		return err
	}
	got, err := r.c.CtrlRecv(r.ctx, serverRank)
	if err != nil {
		return err
	}
	if uint32(got) != want {
		return fmt.Errorf("target checksum %08x, want %08x: %w", got, want, status.ErrFailed)
	}
	return nil
}

// summarize turns per-sample durations into a Result: bandwidth is bytes moved over the sum of
// the samples' durations (the timed part of the wall clock).
func summarize(cfg Config, size uint64, lat []time.Duration) Result {
	res := Result{Transport: cfg.Transport.String(), Op: cfg.Op, Mode: cfg.Mode, Mem: cfg.Mem.String(), BufferMem: cfg.BufferMem.String(), Size: size,
		Iters: len(lat), Lanes: cfg.Lanes, Window: cfg.Window, Verified: cfg.Verify}
	if len(lat) == 0 {
		return res
	}
	var total time.Duration
	for _, d := range lat {
		total += d
	}
	sorted := slices.Clone(lat)
	slices.Sort(sorted)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	res.P50us = us(sorted[len(sorted)/2])
	res.P99us = us(sorted[min(len(sorted)-1, len(sorted)*99/100)])
	res.MeanUs = us(total / time.Duration(len(lat)))
	if total > 0 {
		res.GBps = float64(size) * float64(len(lat)) / total.Seconds() / 1e9
	}
	res.Unsteady = unsteady(lat, total)
	return res
}

func hostOf(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}

func portOf(addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}
