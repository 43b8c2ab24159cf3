package bm

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// DataOp is a set of data-operation types (upstream's smem_bm_data_op_type bit flags).
type DataOp uint32

// The data-operation types. SDMA, DEVICE_RDMA and HOST_URMA need Ascend hardware and are
// refused; HOST_SHM is ours: same-host ranks copy through each other's mapped slices.
const (
	OpSDMA       DataOp = 1
	OpHostRDMA   DataOp = 2 // UCX (RDMA where the fabric has it; builds with -tags ucx)
	OpHostTCP    DataOp = 4
	OpDeviceRDMA DataOp = 8
	OpHostURMA   DataOp = 16
	OpHostSHM    DataOp = 32

	opKnown       = OpSDMA | OpHostRDMA | OpHostTCP | OpDeviceRDMA | OpHostURMA | OpHostSHM
	opUnsupported = OpSDMA | OpDeviceRDMA | OpHostURMA
	// DefaultOps is what a zero Options.DataOps means: every host path.
	DefaultOps = OpHostSHM | OpHostRDMA | OpHostTCP
)

// priority is the order data ops are tried in (upstream: SDMA, DEVICE_RDMA, HOST_RDMA,
// HOST_URMA, HOST_TCP; shared memory, the fastest, first).
var priority = []DataOp{OpHostSHM, OpHostRDMA, OpHostTCP}

var opNames = map[string]DataOp{"DEVICE_SDMA": OpSDMA, "HOST_RDMA": OpHostRDMA, "HOST_TCP": OpHostTCP,
	"DEVICE_RDMA": OpDeviceRDMA, "HOST_URMA": OpHostURMA, "HOST_SHM": OpHostSHM, "DEVICE_MTE": OpSDMA}

// String lists the set's names.
func (o DataOp) String() string {
	var s []string
	for _, p := range []struct {
		op   DataOp
		name string
	}{{OpSDMA, "SDMA"}, {OpHostRDMA, "HOST_RDMA"}, {OpHostTCP, "HOST_TCP"}, {OpDeviceRDMA, "DEVICE_RDMA"}, {OpHostURMA, "HOST_URMA"}, {OpHostSHM, "HOST_SHM"}} {
		if o&p.op != 0 {
			s = append(s, p.name)
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, "|")
}

// kind is the transport a host data op runs on.
func (o DataOp) kind() transport.ConnType {
	switch o {
	case OpHostSHM:
		return transport.SHM
	case OpHostRDMA:
		return transport.UCX
	default:
		return transport.TCP
	}
}

// CopyType is a copy's direction (upstream's smem_bm_copy_type): L = local device memory,
// H = local host memory, G = global (either kind), GH = global host memory.
type CopyType int

// The copy types, with upstream's values.
const (
	L2G CopyType = iota
	G2L
	G2H
	H2G
	L2GH
	GH2L
	GH2H
	H2GH
	G2G
	Auto
	copyTypes
)

var copyNames = [...]string{"L2G", "G2L", "G2H", "H2G", "L2GH", "GH2L", "GH2H", "H2GH", "G2G", "AUTO"}

func (t CopyType) String() string {
	if t >= 0 && t < copyTypes {
		return copyNames[t]
	}
	return fmt.Sprintf("CopyType(%d)", int(t))
}

// ParseCopyType accepts the names String prints, case-insensitively.
func ParseCopyType(s string) (CopyType, error) {
	for i, n := range copyNames {
		if strings.EqualFold(n, s) {
			return CopyType(i), nil
		}
	}
	return 0, fmt.Errorf("bm: copy type %q: %w", s, status.ErrInvalidConfig)
}

// MemType names a kind of memory (upstream's smem_bm_mem_type).
type MemType int

// The memory types, with upstream's values.
const (
	LocalDevice MemType = iota
	LocalHost
	Device // the global HBM space
	Host   // the global DRAM space
)

// Copy flags.
const (
	// FlagAsync returns at once; Wait completes the copy (upstream's ASYNC_COPY_FLAG).
	FlagAsync uint32 = 1 << 0
	// FlagExtend is accepted and ignored (upstream's COPY_EXTEND_FLAG picks an Ascend engine).
	FlagExtend uint32 = 1 << 1
)

// Create flags.
const (
	// FlagCreateWithShm backs the local DRAM slice with Options.DRAMShmFD.
	FlagCreateWithShm uint32 = 1 << 8
)

// Options describe an object (upstream's smem_bm_create_option_t).
type Options struct {
	// MaxDRAM and MaxHBM are the per-rank strides of the two spaces (≥ the local sizes; 0
	// means the local size). LocalDRAM and LocalHBM are the slices this rank backs now. All are
	// multiples of 2 MiB; at least one space must be non-empty.
	MaxDRAM, LocalDRAM uint64
	MaxHBM, LocalHBM   uint64
	// DataOps are the paths this rank may use (0: DefaultOps).
	DataOps DataOp
	// Flags: FlagCreateWithShm (bits 0-7, NUMA binding, are accepted and ignored).
	Flags uint32
	// Tag names this rank's kind (^[A-Za-z0-9_]{1,30}$, default "default"); TagOpInfo lists
	// which data ops two tags may use, "tagA:OP:tagB,..." (OP: HOST_TCP, HOST_RDMA, HOST_SHM,
	// ...); lookup is symmetric, and the rank's own ops are added for its own tag.
	Tag, TagOpInfo string
	// DRAMShmFD backs the local DRAM slice when FlagCreateWithShm is set: a memfd or /dev/shm
	// file (grown to LocalDRAM if smaller) that another process may map too.
	DRAMShmFD int
}

var tagRE = regexp.MustCompile(`^[A-Za-z0-9_]{1,30}$`)

// DefaultTag is the tag of a rank that sets none.
const DefaultTag = "default"

// tagTable maps an unordered tag pair to the ops allowed between them.
type tagTable map[[2]string]DataOp

func tagKey(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// parseTagOps parses "tagA:OP:tagB,..." (upstream's tagOpInfo).
func parseTagOps(s string) (tagTable, error) {
	t := tagTable{}
	if strings.TrimSpace(s) == "" {
		return t, nil
	}
	if len(s) > 255 {
		return nil, fmt.Errorf("bm: tag op info of %d bytes (most 255): %w", len(s), status.ErrInvalidConfig)
	}
	for _, item := range strings.Split(s, ",") {
		f := strings.Split(strings.TrimSpace(item), ":")
		if len(f) != 3 || !tagRE.MatchString(f[0]) || !tagRE.MatchString(f[2]) {
			return nil, fmt.Errorf("bm: tag op %q: want tagA:OP:tagB: %w", item, status.ErrInvalidConfig)
		}
		op, ok := opNames[strings.ToUpper(f[1])]
		if !ok {
			return nil, fmt.Errorf("bm: tag op %q: unknown op %q: %w", item, f[1], status.ErrInvalidConfig)
		}
		t[tagKey(f[0], f[2])] |= op
	}
	return t, nil
}

func (o *Options) validate() error {
	if o.MaxDRAM == 0 {
		o.MaxDRAM = o.LocalDRAM
	}
	if o.MaxHBM == 0 {
		o.MaxHBM = o.LocalHBM
	}
	if o.DataOps == 0 {
		o.DataOps = DefaultOps
	}
	if o.Tag == "" {
		o.Tag = DefaultTag
	}
	switch {
	case o.MaxDRAM == 0 && o.MaxHBM == 0:
		return fmt.Errorf("bm: create: no DRAM and no HBM: %w", status.ErrInvalidConfig)
	case o.LocalDRAM > MaxLocalDRAM || o.LocalHBM > MaxLocalHBM:
		return fmt.Errorf("bm: create: local DRAM %d (most %d), HBM %d (most %d): %w", o.LocalDRAM, MaxLocalDRAM, o.LocalHBM, MaxLocalHBM, status.ErrInvalidConfig)
	case o.MaxDRAM < o.LocalDRAM || o.MaxHBM < o.LocalHBM:
		return fmt.Errorf("bm: create: a stride below its local size: %w", status.ErrInvalidConfig)
	case o.MaxDRAM%SliceAlign != 0 || o.LocalDRAM%SliceAlign != 0 || o.MaxHBM%SliceAlign != 0 || o.LocalHBM%SliceAlign != 0:
		return fmt.Errorf("bm: create: sizes must be multiples of 2 MiB: %w", status.ErrInvalidConfig)
	case o.DataOps&^opKnown != 0:
		return fmt.Errorf("bm: create: unknown data op bits %#x: %w", uint32(o.DataOps&^opKnown), status.ErrInvalidConfig)
	case o.DataOps&^opUnsupported == 0:
		return fmt.Errorf("bm: create: data ops %v need Ascend hardware: %w", o.DataOps, status.ErrUnsupported)
	case !tagRE.MatchString(o.Tag):
		return fmt.Errorf("bm: create: tag %q (want ^[A-Za-z0-9_]{1,30}$): %w", o.Tag, status.ErrInvalidConfig)
	case o.Flags&FlagCreateWithShm != 0 && (o.DRAMShmFD < 0 || o.LocalDRAM == 0):
		return fmt.Errorf("bm: create: FlagCreateWithShm needs a descriptor and a DRAM slice: %w", status.ErrInvalidConfig)
	}
	return nil
}
