package gva

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/status"
)

// FuzzReservePublished: whatever layout another process published (the store is untrusted),
// reserving by it fails with ErrProtocol or ErrLayout, or reserves exactly the published,
// in-window, aligned base; never a panic or a mapping over memory this process uses.
func FuzzReservePublished(f *testing.F) {
	const stride, ranks = 2 << 20, 4
	good, _ := json.Marshal(published{Base: WindowStart + 64<<30, Stride: stride, Ranks: ranks})
	f.Add(good)
	f.Add([]byte(`{"Base":4096,"Stride":2097152,"Ranks":4}`))
	f.Add([]byte(`{"Base":18446744073709551615,"Stride":2097152,"Ranks":4}`))
	f.Add([]byte(`{"Stride":2097152,"Ranks":4}`))
	f.Add([]byte(`{"Base":1,"Stride":2097152,"Ranks":3}`))
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
	if err != nil {
		f.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	kv, err := store.Open(ctx, srv.URL(), store.Config{})
	if err != nil {
		f.Fatal(err)
	}
	defer kv.Close()
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) == 0 || len(raw) > 4096 {
			return // absent (this process publishes) and oversized values are other tests'
		}
		if err := kv.Set(ctx, "layout", raw); err != nil {
			t.Fatal(err)
		}
		s, err := ReservePublished(ctx, kv, "layout", stride, ranks)
		if err != nil {
			if !errors.Is(err, status.ErrProtocol) && !errors.Is(err, ErrLayout) && !errors.Is(err, status.ErrInvalidConfig) {
				t.Fatalf("refusal %v is neither ErrProtocol nor ErrLayout", err)
			}
			return
		}
		defer s.Release()
		var l published
		_ = json.Unmarshal(raw, &l)
		if l.Base != 0 && s.Base != l.Base || s.Base%Align != 0 || s.Base < WindowStart || s.Base+s.Size() > WindowEnd {
			t.Fatalf("published %+v, reserved %#x (%d bytes)", l, s.Base, s.Size())
		}
	})
}
