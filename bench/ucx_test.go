//go:build ucx && cgo

package bench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/hmc-go/hmc/transport"
)

// Every op over UCX, on HMC's memfd buffers and on buffers UCX allocated (--ucx-alloc), with
// UCX over tcp (the target must progress: the ping-pong polls through Communicator.Progress)
// and over shared memory. Every transfer is checksummed.
func TestUCX(t *testing.T) {
	if os.Getenv("UCX_NET_DEVICES") == "" {
		t.Setenv("UCX_NET_DEVICES", "lo")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	for _, tls := range []string{"tcp", "posix,cma,self"} {
		t.Run(tls, func(t *testing.T) {
			t.Setenv("UCX_TLS", tls)
			for _, alloc := range []bool{true, false} {
				for _, cfg := range []Config{{Op: "put", Window: 4}, {Op: "get", Window: 3}, {Op: "lat"}, {Op: "pingpong"}, {Op: "put", Mode: ModeUHM}} {
					cfg.Transport, cfg.UCXAlloc = transport.UCX, alloc
					runCase(ctx, t, cfg)
				}
			}
		})
	}
}
