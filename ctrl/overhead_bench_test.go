package ctrl

import (
	"context"
	"testing"
)

// BenchmarkSendRecvNoWait: one goroutine sends a u64 each way and receives it, the answer
// always in the socket before its Recv: the library's cost per message beyond the system
// calls, without wake-ups.
func BenchmarkSendRecvNoWait(b *testing.B) {
	srv, cli := pair(b, UDS)
	ctx := context.Background()
	for b.Loop() {
		if err := cli.SendU64(ctx, 0, 1); err != nil {
			b.Fatal(err)
		}
		if _, err := srv.RecvU64(ctx, 1); err != nil {
			b.Fatal(err)
		}
	}
}
