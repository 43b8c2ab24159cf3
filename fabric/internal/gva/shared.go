package gva

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// published is a space's layout as its first creator publishes it.
type published struct {
	Base, Stride uint64
	Ranks        int
}

// ReservePublished reserves a space of ranks × stride bytes at the base published under key in
// kv, or first-fit when the key is absent, publishing its base (create-if-absent CAS; a process
// that loses the race moves to the winner's base). Every process of a job so names the same
// bytes by the same address, whatever it reserved before. A published layout with another
// stride or rank count is ErrLayout.
func ReservePublished(ctx context.Context, kv store.Store, key string, stride uint64, ranks int) (*Space, error) {
	raw, err := kv.Get(ctx, key, 0)
	if err != nil && !errors.Is(err, store.ErrNotExist) {
		return nil, fmt.Errorf("gva: reading layout %s: %w", key, err)
	}
	for attempt := 0; ; attempt++ {
		var l published
		if raw != nil {
			if err := json.Unmarshal(raw, &l); err != nil {
				return nil, fmt.Errorf("gva: layout %s: %w: %w", key, status.ErrProtocol, err)
			}
			if l.Stride != stride || l.Ranks != ranks {
				return nil, fmt.Errorf("gva: %s exists with %d ranks × %#x bytes, not %d × %#x: %w", key, l.Ranks, l.Stride, ranks, stride, ErrLayout)
			}
		}
		s, err := Reserve(l.Base, stride, ranks)
		if err != nil || raw != nil {
			return s, err
		}
		enc, _ := json.Marshal(published{Base: s.Base, Stride: stride, Ranks: ranks}) // always marshals
		prev, err := kv.CompareAndSwap(ctx, key, nil, enc)
		if err != nil {
			_ = s.Release()
			return nil, fmt.Errorf("gva: publishing layout %s: %w", key, err)
		}
		if prev == nil {
			return s, nil // ours is the layout
		}
		_ = s.Release() // another process was first: take its base
		raw = prev
		if attempt > 2 {
			return nil, fmt.Errorf("gva: layout %s keeps changing: %w", key, status.ErrFailed)
		}
	}
}

// NewSliceFD returns a sealed memfd of size bytes for a rank's slice (name shows in
// /proc/<pid>/maps).
func NewSliceFD(name string, size uint64) (int, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("gva: memfd: %w: %w", status.ErrFailed, err)
	}
	if err = unix.Ftruncate(fd, int64(size)); err == nil {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
	}
	if err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("gva: slice of %d bytes: %w: %w", size, status.ErrFailed, err)
	}
	return fd, nil
}

// MapPeer maps co-located rank's slice (size bytes at its place in the space) at its global
// address, from the memfd its owner hands over on ep (a shared-memory endpoint).
func (s *Space) MapPeer(ctx context.Context, ep transport.Endpoint, rank int, size uint64) ([]byte, error) {
	sh, ok := ep.(transport.RegionSharer)
	if !ok {
		return nil, fmt.Errorf("gva: the endpoint cannot share regions: %w", status.ErrUnsupported)
	}
	at := s.Slice(rank)
	sr, err := sh.ShareRegion(ctx, transport.Remote{Addr: at}, size)
	if err != nil {
		return nil, err
	}
	defer unix.Close(sr.FD)
	if sr.Addr != at || sr.Size != size {
		return nil, fmt.Errorf("gva: rank %d serves [%#x, +%d) where its slice is [%#x, +%d): %w", rank, sr.Addr, sr.Size, at, size, status.ErrProtocol)
	}
	return s.MapShared(at-s.Base, sr.Size, sr.FD, sr.FDOffset)
}
