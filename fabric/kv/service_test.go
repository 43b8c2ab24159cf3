package kv

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

// The master's wire is JSON requests from clients the master does not trust: any method and
// body must be answered or refused, never panic, and leave the pool's accounting whole (used
// within total, no object without a replica).
func FuzzHandle(f *testing.F) {
	for _, seed := range []struct{ method, body string }{
		{"mount", `{"client":"A","segment":{"Name":"a","Base":4096,"Size":1048576}}`},
		{"put_start", `{"client":"A","key":"k","size":100,"replicas":1}`},
		{"put_end", `{"client":"A","key":"k"}`},
		{"batch_put_start", `{"client":"A","keys":["x","y"],"sizes":[10,20],"replicas":1,"upsert":true}`},
		{"batch_get", `{"keys":["k","x",""]}`},
		{"batch_remove", `{"keys":["k"],"force":true}`},
		{"remove_regex", `{"pattern":"(","force":true}`},
		{"batch_put_start", `{"keys":["a"],"sizes":[]}`},
		{"unmount", `{"client":"B","segment":{"Name":"a"}}`},
		{"leave", `{"client":"A"}`},
		{"nothing", `null`},
		{"get", `{"key":1}`},
	} {
		f.Add(seed.method, []byte(seed.body))
	}
	f.Fuzz(func(t *testing.T, method string, body []byte) {
		m := NewMaster(MasterConfig{LeaseTTL: time.Second})
		if err := m.MountSegment(Segment{Name: "s", Client: "S", Base: 1 << 30, Size: 1 << 20}); err != nil {
			t.Fatal(err)
		}
		s := &Server{m: m, cfg: ServerConfig{ClientTTL: time.Second}, beats: map[string]time.Time{}}
		for i := 0; i < 2; i++ { // twice: a second put_start, end or remove sees the first's state
			out, err := s.handle(context.Background(), method, json.RawMessage(body))
			if err == nil {
				if _, merr := json.Marshal(out); merr != nil {
					t.Fatalf("%s: an answer that does not encode: %v", method, merr)
				}
			}
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.used > m.total {
			t.Fatalf("%d bytes used of %d", m.used, m.total)
		}
		for k, o := range m.objects {
			if len(o.replicas) == 0 || o.key != k {
				t.Fatalf("object %q: %+v", k, o)
			}
		}
	})
}
