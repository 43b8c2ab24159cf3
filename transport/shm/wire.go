package shm

import (
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/hmc-go/hmc/status"
)

const (
	magic      = "HMCS"
	version    = 1
	helloSize  = 64
	maxIPLen   = 46
	offerSize  = 56
	bootIDSize = 40
)

// hello: initiator → target, 64 bytes: magic, version u16, listen port u16, rank u32, IP
// length u8, reserved [3], the initiator's IP as text (at most 46 bytes), zero padding.
type hello struct {
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
	if v := binary.LittleEndian.Uint16(b[4:]); v != version {
		return hello{}, fmt.Errorf("shm: initiator speaks version %d, target %d: %w", v, version, status.ErrUnsupported)
	}
	n := int(b[12])
	if n > maxIPLen {
		return hello{}, fmt.Errorf("shm: hello IP of %d bytes: %w", n, status.ErrProtocol)
	}
	return hello{rank: binary.LittleEndian.Uint32(b[8:]), listenPort: binary.LittleEndian.Uint16(b[6:]), ip: string(b[16 : 16+n])}, nil
}

// offer: target → initiator, sent with the memfd: magic, version u16, reserved u16, region
// size u64, boot id [40] (the kernel's boot_id text, NUL-padded), plus reserved to 56 bytes.
type offer struct {
	size   uint64
	bootID [bootIDSize]byte
}

func (o offer) encode() []byte {
	b := make([]byte, offerSize)
	copy(b, magic)
	binary.LittleEndian.PutUint16(b[4:], version)
	binary.LittleEndian.PutUint64(b[8:], o.size)
	copy(b[16:16+bootIDSize], o.bootID[:])
	return b
}

func decodeOffer(b []byte) (offer, error) {
	var o offer
	if len(b) != offerSize || string(b[:4]) != magic {
		return o, fmt.Errorf("shm: bad offer: %w", status.ErrProtocol)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != version {
		return o, fmt.Errorf("shm: target speaks version %d, initiator %d: %w", v, version, status.ErrUnsupported)
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
