package shm

import (
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
)

const (
	magic = "HMCS"
	// version is the highest version this side speaks: the initiator offers it in its hello,
	// the target answers in its offer with the highest both speak (minVersion at least).
	// Version 2 adds region requests on the link after the offer; version 3 the generation of
	// a region's control slot in its answer (a target reuses the slots of deregistered regions
	// only for version-3 peers, which check it); version 4 device regions (an answer carries
	// the device allocation's IPC handle).
	version    = 4
	minVersion = 1
	helloSize  = 64
	maxIPLen   = 46
	offerSize  = 56
	bootIDSize = 40
)

// hello: initiator → target, 64 bytes: magic, version u16, listen port u16, rank u32, IP
// length u8, reserved [3], the initiator's IP as text (at most 46 bytes), zero padding.
type hello struct {
	version    uint16 // decoded: the version both sides run
	rank       uint32
	listenPort uint16
	ip         string
}

func (h hello) encode() []byte {
	b := make([]byte, helloSize)
	copy(b, magic)
	binary.LittleEndian.PutUint16(b[4:], version)
	binary.LittleEndian.PutUint16(b[6:], h.listenPort)
	binary.LittleEndian.PutUint32(b[8:], h.rank)
	ip := h.ip
	if len(ip) > maxIPLen {
		ip = ""
	}
	b[12] = byte(len(ip))
	copy(b[16:], ip)
	return b
}

func decodeHello(b []byte) (hello, error) {
	if len(b) != helloSize || string(b[:4]) != magic {
		return hello{}, fmt.Errorf("shm: bad hello: %w", status.ErrProtocol)
	}
	v := binary.LittleEndian.Uint16(b[4:])
	if v < minVersion {
		return hello{}, fmt.Errorf("shm: initiator speaks versions up to %d, target %d..%d: %w", v, minVersion, version, status.ErrUnsupported)
	}
	n := int(b[12])
	if n > maxIPLen {
		return hello{}, fmt.Errorf("shm: hello IP of %d bytes: %w", n, status.ErrProtocol)
	}
	if b[13] != 0 || b[14] != 0 || b[15] != 0 || strings.Trim(string(b[16+n:]), "\x00") != "" {
		return hello{}, fmt.Errorf("shm: reserved hello bytes set: %w", status.ErrProtocol)
	}
	return hello{version: min(v, version), rank: binary.LittleEndian.Uint32(b[8:]), listenPort: binary.LittleEndian.Uint16(b[6:]), ip: string(b[16 : 16+n])}, nil
}

// offer: target → initiator, sent with the memfd: magic, version u16, flags u16 (version 4;
// reserved before), region size u64, boot id [40] (the kernel's boot_id text, NUL-padded), plus
// reserved to 56 bytes. With offerDevice the region is device memory: a devRecord follows in the
// same write, and the memfd is the emulated GPU's (none for a real device's).
type offer struct {
	version uint16 // the version the link runs
	flags   uint16
	size    uint64
	bootID  [bootIDSize]byte
}

// offerDevice flags an offer of a device region (version 4).
const offerDevice = 1

func (o offer) encode() []byte {
	b := make([]byte, offerSize)
	copy(b, magic)
	binary.LittleEndian.PutUint16(b[4:], o.version)
	binary.LittleEndian.PutUint16(b[6:], o.flags)
	binary.LittleEndian.PutUint64(b[8:], o.size)
	copy(b[16:16+bootIDSize], o.bootID[:])
	return b
}

func decodeOffer(b []byte) (offer, error) {
	var o offer
	if len(b) != offerSize || string(b[:4]) != magic {
		return o, fmt.Errorf("shm: bad offer: %w", status.ErrProtocol)
	}
	o.version = binary.LittleEndian.Uint16(b[4:])
	if o.version < minVersion || o.version > version {
		return o, fmt.Errorf("shm: target runs version %d, initiator %d..%d: %w", o.version, minVersion, version, status.ErrUnsupported)
	}
	o.flags = binary.LittleEndian.Uint16(b[6:])
	if o.flags&^offerDevice != 0 || (o.flags != 0 && o.version < 4) {
		return o, fmt.Errorf("shm: offer flags %#x on a version-%d link: %w", o.flags, o.version, status.ErrProtocol)
	}
	o.size = binary.LittleEndian.Uint64(b[8:])
	copy(o.bootID[:], b[16:16+bootIDSize])
	return o, nil
}

// BootID returns this kernel's boot id (/proc/sys/kernel/random/boot_id), which identifies the
// host: two processes share memory only if they run on the same booted kernel.
var BootID = sync.OnceValues(func() ([bootIDSize]byte, error) {
	var id [bootIDSize]byte
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return id, fmt.Errorf("shm: reading the boot id: %w: %w", status.ErrUnsupported, err)
	}
	copy(id[:], strings.TrimSpace(string(b)))
	return id, nil
})

// Region requests (version 2): after the offer, the initiator may ask the target about its
// registered regions on the link, one request at a time (docs/wire/shm.md).
const (
	linkReqSize  = 48
	linkRespSize = 48

	lopResolveKey  = 1 // where is region key (and may I reach [off, off+length) of it)?
	lopResolveAddr = 2 // which region holds [addr, addr+length)?
	lopAtomic      = 3 // run an atomic on a word of a region without a memfd

	lopResolved = 0x81
	lopAtomicOK = 0x83

	lstOK         = 0
	lstOutOfRange = 1
	lstNotFound   = 2
	lstMisaligned = 3
	lstNoSlot     = 4 // the target's control page has no slot left for another region

	lstDevice = 5 // version 4: the region is device memory the target could not export

	lflagRegionFD  = 1 // the region's memfd is attached (the emulated GPU's allocation, with lflagDevice)
	lflagControlFD = 2 // the target's control memfd is attached
	lflagDevice    = 4 // version 4: device memory; a devRecord follows the answer

	devRecordSize = 96
)

// devRecord is a device region's IPC handle (version 4), sent right after its answer: vendor
// u8 (memory.Type), emulated u8, reserved u16, device i32, allocation size u64, the region's
// offset in the allocation u64, the driver's handle [64] (zero for the emulation, whose memfd
// is attached instead), the allocation's address in the target u64 (a target in the
// initiator's own process is reached there: CUDA does not open a handle in its own process).
type devRecord struct {
	vendor   uint8
	emulated bool
	device   int32
	size     uint64
	offset   uint64
	raw      [64]byte
	base     uint64
}

// handle is the record as memory's IPC handle of a target whose process id the kernel gave
// (fd: the emulated GPU's memfd, or -1).
func (d devRecord) handle(pid, fd int) memory.IPCHandle {
	return memory.IPCHandle{Vendor: memory.Type(d.vendor), Device: int(d.device), Raw: d.raw, FD: fd, Size: d.size,
		Offset: d.offset, Base: d.base, PID: pid}
}

func recordOf(h memory.IPCHandle) devRecord {
	return devRecord{vendor: uint8(h.Vendor), emulated: h.Emulated(), device: int32(h.Device), size: h.Size, offset: h.Offset, raw: h.Raw, base: h.Base}
}

func (d devRecord) encode(b []byte) {
	b[0] = d.vendor
	if d.emulated {
		b[1] = 1
	}
	binary.LittleEndian.PutUint32(b[4:], uint32(d.device))
	binary.LittleEndian.PutUint64(b[8:], d.size)
	binary.LittleEndian.PutUint64(b[16:], d.offset)
	copy(b[24:], d.raw[:])
	binary.LittleEndian.PutUint64(b[88:], d.base)
}

func decodeDevRecord(b []byte) (devRecord, error) {
	d := devRecord{vendor: b[0], emulated: b[1] == 1, device: int32(binary.LittleEndian.Uint32(b[4:])),
		size: binary.LittleEndian.Uint64(b[8:]), offset: binary.LittleEndian.Uint64(b[16:])}
	copy(d.raw[:], b[24:88])
	d.base = binary.LittleEndian.Uint64(b[88:])
	if b[1] > 1 || b[2] != 0 || b[3] != 0 || d.device < 0 || d.size == 0 || d.offset >= d.size {
		return d, fmt.Errorf("shm: bad device record (device %d, offset %d of %d): %w", d.device, d.offset, d.size, status.ErrProtocol)
	}
	return d, nil
}

// linkReq is a region request, initiator → target.
type linkReq struct {
	op, aop          uint8
	key              uint32
	id               uint64
	addr             uint64 // an offset in region key, or an address when key is 0
	length           uint64
	operand, compare uint64
}

func (r linkReq) encode(b *[linkReqSize]byte) {
	*b = [linkReqSize]byte{}
	b[0], b[1] = r.op, r.aop
	binary.LittleEndian.PutUint32(b[4:], r.key)
	binary.LittleEndian.PutUint64(b[8:], r.id)
	binary.LittleEndian.PutUint64(b[16:], r.addr)
	binary.LittleEndian.PutUint64(b[24:], r.length)
	binary.LittleEndian.PutUint64(b[32:], r.operand)
	binary.LittleEndian.PutUint64(b[40:], r.compare)
}

func decodeLinkReq(b *[linkReqSize]byte) (linkReq, error) {
	r := linkReq{op: b[0], aop: b[1], key: binary.LittleEndian.Uint32(b[4:]), id: binary.LittleEndian.Uint64(b[8:]),
		addr: binary.LittleEndian.Uint64(b[16:]), length: binary.LittleEndian.Uint64(b[24:]),
		operand: binary.LittleEndian.Uint64(b[32:]), compare: binary.LittleEndian.Uint64(b[40:])}
	switch {
	case r.op < lopResolveKey || r.op > lopAtomic:
		return r, fmt.Errorf("shm: link request op %d: %w", r.op, status.ErrProtocol)
	case b[2] != 0 || b[3] != 0:
		return r, fmt.Errorf("shm: reserved link request bits set: %w", status.ErrProtocol)
	case (r.op == lopResolveKey) != (r.key != 0) && r.op != lopAtomic:
		return r, fmt.Errorf("shm: link request op %d with key %d: %w", r.op, r.key, status.ErrProtocol)
	case r.op == lopAtomic && (!buffer.AtomicOp(r.aop).Valid() || r.length != 8):
		return r, fmt.Errorf("shm: link atomic %d on %d bytes: %w", r.aop, r.length, status.ErrProtocol)
	case r.op != lopAtomic && (r.aop != 0 || r.operand != 0 || r.compare != 0):
		return r, fmt.Errorf("shm: atomic fields on a resolve request: %w", status.ErrProtocol)
	}
	return r, nil
}

// linkResp answers a region request, target → initiator, with the descriptors its flags name.
type linkResp struct {
	op, status, flags uint8
	key               uint32
	id                uint64
	addr, size        uint64    // the region (resolved); addr holds the old value of an atomic
	fdOff             uint64    // the region's offset in its memfd
	slot              uint32    // the region's word in the control memfd
	gen               uint32    // the slot's generation (version 3; 0 before), at most genMax
	dev               devRecord // with lflagDevice
}

func (r linkResp) encode(b *[linkRespSize]byte) {
	*b = [linkRespSize]byte{}
	b[0], b[1], b[2] = r.op, r.status, r.flags
	binary.LittleEndian.PutUint32(b[4:], r.key)
	binary.LittleEndian.PutUint64(b[8:], r.id)
	binary.LittleEndian.PutUint64(b[16:], r.addr)
	binary.LittleEndian.PutUint64(b[24:], r.size)
	binary.LittleEndian.PutUint64(b[32:], r.fdOff)
	binary.LittleEndian.PutUint32(b[40:], r.slot)
	binary.LittleEndian.PutUint32(b[44:], r.gen)
}

func decodeLinkResp(b *[linkRespSize]byte) (linkResp, error) {
	r := linkResp{op: b[0], status: b[1], flags: b[2], key: binary.LittleEndian.Uint32(b[4:]), id: binary.LittleEndian.Uint64(b[8:]),
		addr: binary.LittleEndian.Uint64(b[16:]), size: binary.LittleEndian.Uint64(b[24:]),
		fdOff: binary.LittleEndian.Uint64(b[32:]), slot: binary.LittleEndian.Uint32(b[40:]), gen: binary.LittleEndian.Uint32(b[44:])}
	switch {
	case r.op != lopResolved && r.op != lopAtomicOK:
		return r, fmt.Errorf("shm: link response op %#x: %w", r.op, status.ErrProtocol)
	case r.status > lstDevice || r.flags > lflagRegionFD|lflagControlFD|lflagDevice || b[3] != 0 || r.gen > genMax:
		return r, fmt.Errorf("shm: bad link response fields: %w", status.ErrProtocol)
	}
	return r, nil
}
