package comm

import (
	"errors"
	"testing"

	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/stack"
)

// Ids taken in any order, some held past a whole ring of newer ones (which then spill to the
// map): each comes back once, with its own Op, and nothing else does.
func TestOpTable(t *testing.T) {
	var tb opTable
	ops := map[uint64]*transport.Op{}
	const n = 3*opRing + 7
	for id := uint64(1); id <= n; id++ {
		op := transport.NewOp(1)
		ops[id] = op
		tb.add(id, op)
		if id%3 == 0 && id > 10 { // wait for most ids soon; every third one stays behind
			continue
		}
		if got, ok := tb.take(id); !ok || got != op {
			t.Fatalf("take(%d) = %p, %v; want %p", id, got, ok, op)
		}
		delete(ops, id)
	}
	if tb.len() != len(ops) {
		t.Fatalf("len %d, want %d", tb.len(), len(ops))
	}
	if tb.spill == nil {
		t.Fatal("nothing spilled past the ring")
	}
	for id, op := range ops {
		if got, ok := tb.take(id); !ok || got != op {
			t.Fatalf("take(%d) late = %p, %v; want %p", id, got, ok, op)
		}
		if _, ok := tb.take(id); ok {
			t.Fatalf("take(%d) twice", id)
		}
	}
	if _, ok := tb.take(n + 1); ok || tb.len() != 0 {
		t.Fatalf("unknown id found, or %d left", tb.len())
	}
}

// Every Config has a DefaultConfig that validates and a Validate that refuses the impossible
// with ErrInvalidConfig: the Communicator's and its control plane's, and the transports' (in
// stack.New).
func TestConfigDefaultsValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	bad := []func(*Config){
		func(c *Config) { c.NumChannels = -1 },
		func(c *Config) { c.Ctrl.InboxDepth = -1 },
	}
	for i, f := range bad {
		c := DefaultConfig()
		f(&c)
		if err := c.Validate(); !errors.Is(err, status.ErrInvalidConfig) {
			t.Errorf("case %d: %v", i, err)
		}
	}
	if err := stack.DefaultConfig().Validate(); err != nil {
		t.Fatalf("stack.DefaultConfig: %v", err)
	}
	badStack := []func(*stack.Config){
		func(c *stack.Config) { c.TCP.Lanes = -1 },
		func(c *stack.Config) { c.SHM.Workers = -1 },
		func(c *stack.Config) { c.UCX.SpinTime = -1 },
	}
	for i, f := range badStack {
		c := stack.DefaultConfig()
		f(&c)
		if _, err := stack.New(c); !errors.Is(err, status.ErrInvalidConfig) {
			t.Errorf("stack case %d: %v", i, err)
		}
	}
}
