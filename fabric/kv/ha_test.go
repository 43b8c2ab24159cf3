package kv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/internal/childtest"
	"github.com/hmc-go/hmc/internal/etcdtest"
)

// masterChild is a master of a group on a store (HMC_KV_STORE) in its own process: it prints
// READY and serves, leading or standing by, until killed or its stdin closes.
func masterChild() int {
	h, err := StartHA(context.Background(), HAConfig{Store: os.Getenv("HMC_KV_STORE"), Heartbeat: 200 * time.Millisecond,
		SnapshotEvery: 16, Master: MasterConfig{LeaseTTL: 300 * time.Millisecond},
		Server: ServerConfig{Addr: "127.0.0.1:0", ClientTTL: 3 * time.Second}})
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	defer h.Close()
	fmt.Println("READY")
	for range childtest.ParentSays() {
	}
	return 0
}

// A master killed under etcd: two masters in two processes elect one leader; clients find it
// through the store, lend segments and put objects (single and batched, one and two replicas,
// enough for the leader to snapshot its log and trim it); the leader is killed with SIGKILL;
// the standby loads the pool from the store and leads, and the clients, without being told,
// read every object byte for byte, put and remove more.
func TestMasterFailover(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	url := cl.URL("kvtest")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	st, err := store.Open(ctx, url, store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	startMaster := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		_, lines := childtest.Start(t, cmd, 16, "HMC_KV_CHILD=master", "HMC_KV_STORE="+url)
		select {
		case l := <-lines:
			if l != "READY" {
				t.Fatalf("master said %q", l)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("master did not start")
		}
		return cmd
	}
	waitLeader := func(not string) string {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if a, err := LeaderOf(ctx, st, ""); err == nil && a != not {
				return a
			}
		}
		t.Fatalf("no new leader (was %s)", not)
		return ""
	}
	first := startMaster()
	lead1 := waitLeader("")
	second := startMaster()
	defer func() { _ = second.Process.Kill(); _ = second.Wait() }()

	a, err := NewClient(ctx, ClientConfig{Master: url, SegmentSize: 16 << 20, Heartbeat: 200 * time.Millisecond, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewClient(ctx, ClientConfig{Master: url, SegmentSize: 16 << 20, Heartbeat: 200 * time.Millisecond, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	vals := map[string][]byte{}
	for i := 0; i < 24; i++ {
		k := fmt.Sprint("one/", i)
		vals[k] = pattern(i, 10000+i*1000)
		if err := a.Put(ctx, k, vals[k], 1+i%2); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	var items []Item
	for i := 0; i < 20; i++ {
		k := fmt.Sprint("batch/", i)
		vals[k] = pattern(100+i, 30000)
		items = append(items, Item{Key: k, Parts: []Span{SpanOf(vals[k])}})
	}
	for i, err := range b.BatchPut(ctx, items, PutOptions{Replicas: 2}) {
		if err != nil {
			t.Fatalf("batch put %d: %v", i, err)
		}
	}
	if err := a.Remove(ctx, "one/0", true); err != nil {
		t.Fatal(err)
	}
	delete(vals, "one/0")

	_ = first.Process.Kill() // SIGKILL: no goodbye to the store
	_ = first.Wait()
	killed := time.Now()
	for k, v := range vals {
		got, err := b.Get(ctx, k)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get %s after the leader died: %d bytes, %v", k, len(got), err)
		}
	}
	lead2 := waitLeader(lead1)
	t.Logf("leader %s killed; %s leads, the clients' first get answered %v later", lead1, lead2, time.Since(killed).Round(time.Millisecond))
	if ok, err := a.Exist(ctx, "one/0"); err != nil || ok {
		t.Fatalf("a removed object came back: %v %v", ok, err)
	}
	if err := a.Put(ctx, "after", []byte("the new leader places this"), 2); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Get(ctx, "after"); err != nil || string(got) != "the new leader places this" {
		t.Fatalf("get after takeover: %q %v", got, err)
	}
	if err := a.Put(ctx, "one/1", []byte("x"), 1); CodeOf(err) != ObjectAlreadyExists {
		t.Fatalf("a key the old leader stored: %v", err)
	}
}

// A new leader reads each older epoch's log only up to the end its successor recorded: what a
// deposed leader wrote after it was replaced is never applied (its clients' changes in that
// window are lost, never mixed into the new leader's state).
func TestLoadPoolHonoursEpochEnds(t *testing.T) {
	srv, err := store.Listen("tcp://127.0.0.1:0", store.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := store.Open(ctx, srv.URL(), store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const pfx = "kv/p/"
	seg := Segment{Name: "s", Client: "C", Base: 1 << 30, Size: 1 << 20}
	obj := func(k string, off uint64) []placed {
		return []placed{{Key: k, Size: 4096, Replicas: []Buffer{{Client: "C", Segment: "s", Addr: seg.Base + off, Size: 4096}}}}
	}
	log := map[string]entry{
		"log/1/1": {Op: "mount", Segment: seg},
		"log/1/2": {Op: "start", Client: "C", Objects: obj("a", 0)},
		"log/1/3": {Op: "end", Client: "C", Keys: []string{"a"}},
		"log/1/4": {Op: "start", Client: "C", Objects: obj("zombie", 8192)}, // after end/1: the deposed leader's
		"log/2/1": {Op: "start", Client: "C", Objects: obj("b", 8192)},
		"log/2/2": {Op: "end", Client: "C", Keys: []string{"b"}},
	}
	for k, e := range log {
		b, _ := json.Marshal(e)
		if err := st.Set(ctx, pfx+k, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Set(ctx, pfx+"end/1", []byte("3")); err != nil {
		t.Fatal(err)
	}
	m := NewMaster(MasterConfig{})
	ranges, err := loadPool(ctx, st, pfx, m, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(ranges) != 2 || ranges[0] != (logRange{1, 3}) || ranges[1] != (logRange{2, 2}) {
		t.Fatalf("ranges %+v", ranges)
	}
	if !m.Exist("a") || !m.Exist("b") || m.Stats().Objects != 2 {
		t.Fatalf("state after replay: a %v b %v, %+v", m.Exist("a"), m.Exist("b"), m.Stats())
	}
}
