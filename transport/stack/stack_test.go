package stack

import (
	"errors"
	"testing"

	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/ucx"
)

// The usual set: TCP and shared memory always; UCX and RDMA, or the reason they are missing.
func TestNew(t *testing.T) {
	r, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []transport.ConnType{transport.TCP, transport.SHM} {
		if tr, err := r.Get(k); err != nil || tr.Type() != k {
			t.Fatalf("%v: %v, %v", k, tr, err)
		}
	}
	_, err = r.Get(transport.RDMA)
	if !ucx.Built && (!errors.Is(err, status.ErrUnsupported) || err == nil) {
		t.Fatalf("RDMA without UCX: %v", err)
	}
	if _, err := New(Config{SHM: DefaultConfig().SHM, TCP: DefaultConfig().TCP, UCX: ucx.Config{SpinTime: -1}}); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("a negative spin time: %v", err)
	}
	if a, b := SHMSocketName(2025), SHMSocketName(2026); a == "" || a == b {
		t.Fatalf("socket names %q, %q do not follow the port", a, b)
	}
}
