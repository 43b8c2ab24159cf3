package bm

import (
	"sync"
	"testing"
	"time"
)

// TestViewsLockAMemberOnce: a batch (or one copy) whose views reach one mapped member twice
// holds its lock once, so an unmapping that waits for the lock between the two views (a
// member leaving mid-batch) does not block the second view forever; it proceeds at release.
func TestViewsLockAMemberOnce(t *testing.T) {
	m := &member{rank: 1, mapd: make([]byte, 1<<16)}
	b := &BigMemory{rank: 0, members: map[int]*member{1: m}}
	var h held
	if _, ok, err := b.view(end{w: globalHost, rank: 1, off: 0}, 4096, &h); !ok || err != nil {
		t.Fatalf("first view: %v %v", ok, err)
	}
	var unmapped sync.WaitGroup
	unmapped.Add(1)
	go func() { // as drop: the lock, then the member is gone
		defer unmapped.Done()
		m.mu.Lock()
		m.gone, m.mapd = true, nil
		m.mu.Unlock()
	}()
	time.Sleep(20 * time.Millisecond) // the unmapping now waits for the lock
	done := make(chan error, 1)
	go func() {
		_, _, err := b.view(end{w: globalHost, rank: 1, off: 8192}, 4096, &h)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("second view of the member: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second view of a held member blocked behind the unmapping")
	}
	if len(h) != 1 {
		t.Fatalf("held %d locks of one member, want 1", len(h))
	}
	h.release()
	unmapped.Wait()
	if _, _, err := b.view(end{w: globalHost, rank: 1}, 4096, &h); err == nil {
		t.Fatal("a view of a dropped member succeeded")
	}
}
