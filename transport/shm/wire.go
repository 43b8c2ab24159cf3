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
	helloSize  = 16
	offerSize  = 56
	bootIDSize = 40
)

// hello: initiator → target: magic, version u16, reserved u16, rank u32, reserved u32.
func encodeHello(rank uint32) []byte {
	b := make([]byte, helloSize)
	copy(b, magic)
	binary.LittleEndian.PutUint16(b[4:], version)
	binary.LittleEndian.PutUint32(b[8:], rank)
	return b
}

func decodeHello(b []byte) (uint32, error) {
	if len(b) != helloSize || string(b[:4]) != magic {
		return 0, fmt.Errorf("shm: bad hello: %w", status.ErrProtocol)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != version {
		return 0, fmt.Errorf("shm: initiator speaks version %d, target %d: %w", v, version, status.ErrUnsupported)
	}
	return binary.LittleEndian.Uint32(b[8:]), nil
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
