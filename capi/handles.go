//go:build cgo

package main

import (
	"fmt"
	"sync"

	"github.com/hmc-go/hmc/status"
)

// handles maps opaque C handles to Go objects. Handles are never reused within a process, so a
// stale handle is an error, not another object; a handle of the wrong kind is one too.
type handles struct {
	mu   sync.Mutex
	next uint64
	objs map[uint64]any
}

var table = handles{next: 1, objs: make(map[uint64]any)}

func (h *handles) add(v any) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	id := h.next
	h.next++
	h.objs[id] = v
	return id
}

func (h *handles) remove(id uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.objs, id)
}

func get[T any](id uint64) (T, error) {
	table.mu.Lock()
	v, ok := table.objs[id]
	table.mu.Unlock()
	t, isT := v.(T)
	if !ok || !isT {
		var zero T
		return zero, fmt.Errorf("hmc: handle %d is not a live %T: %w", id, zero, status.ErrInvalidConfig)
	}
	return t, nil
}
