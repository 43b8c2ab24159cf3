package group

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/status"
)

// MaxNumbers is the size of the atomic number space: numbers are 0..MaxNumbers-1.
const MaxNumbers = 1024

const numKey = "AT_NUM"

// AllocNumber takes the lowest free number of the group's 0..1023 space (a bitmap under one
// key, updated by CompareAndSwap). A full space is store.ErrFailed.
func (g *Group) AllocNumber(ctx context.Context) (int, error) {
	ctx, cancel := g.deadline(ctx)
	defer cancel()
	for {
		cur, bm, err := g.bitmap(ctx)
		if err != nil {
			return -1, err
		}
		n := -1
		for i := range MaxNumbers {
			if bm[i/8]&(1<<(i%8)) == 0 {
				n = i
				break
			}
		}
		if n < 0 {
			return -1, fmt.Errorf("%w: all %d numbers are taken", store.ErrFailed, MaxNumbers)
		}
		bm[n/8] |= 1 << (n % 8)
		if ok, err := g.swapBitmap(ctx, cur, bm); err != nil || ok {
			return n, err
		}
	}
}

// ReleaseNumber frees n, retrying until its own swap succeeds (upstream's retry condition is
// inverted). Releasing a free number is status.ErrInvalidConfig.
func (g *Group) ReleaseNumber(ctx context.Context, n int) error {
	if n < 0 || n >= MaxNumbers {
		return fmt.Errorf("%w: number %d outside 0..%d", status.ErrInvalidConfig, n, MaxNumbers-1)
	}
	ctx, cancel := g.deadline(ctx)
	defer cancel()
	for {
		cur, bm, err := g.bitmap(ctx)
		if err != nil {
			return err
		}
		if bm[n/8]&(1<<(n%8)) == 0 {
			return fmt.Errorf("%w: number %d is not allocated", status.ErrInvalidConfig, n)
		}
		bm[n/8] &^= 1 << (n % 8)
		if ok, err := g.swapBitmap(ctx, cur, bm); err != nil || ok {
			return err
		}
	}
}

func (g *Group) bitmap(ctx context.Context) (cur, bm []byte, err error) {
	cur, err = g.st.Get(ctx, numKey, 0)
	if errors.Is(err, store.ErrNotExist) {
		cur, err = nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	bm = make([]byte, MaxNumbers/8)
	copy(bm, cur)
	return cur, bm, nil
}

func (g *Group) swapBitmap(ctx context.Context, cur, bm []byte) (bool, error) {
	prev, err := g.st.CompareAndSwap(ctx, numKey, cur, bm)
	if err != nil {
		return false, err
	}
	return bytes.Equal(prev, cur) && (prev == nil) == (cur == nil), nil
}

const exitKey = "EXIT"

// Exit broadcasts status to every member that registered OnExit (upstream's global exit).
func (g *Group) Exit(ctx context.Context, status string) error {
	return g.st.Set(ctx, exitKey, []byte(status))
}

// OnExit calls fn with the status of the first Exit of the group (at once if it happened).
// stop cancels the watch.
func (g *Group) OnExit(fn func(status string)) (stop func()) {
	return store.Watch(g.st, exitKey, func(v []byte, err error) {
		if err == nil {
			fn(string(v))
		}
	})
}
