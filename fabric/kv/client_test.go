package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/internal/childtest"
	"github.com/hmc-go/hmc/internal/etcdtest"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

func TestMain(m *testing.M) {
	switch os.Getenv("HMC_KV_CHILD") {
	case "":
	case "master":
		os.Exit(masterChild())
	default:
		os.Exit(child())
	}
	goleak.VerifyTestMain(m, etcdtest.IgnoreGoroutines()...)
}

// pattern is seed's n bytes.
func pattern(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + seed + i>>10)
	}
	return b
}

// child is a pool client in its own process (HMC_KV_CHILD=client, HMC_KV_MASTER): it lends a
// 32 MiB segment, prints READY <id>, then runs its parent's lines: "put <key> <seed> <n>
// <replicas>" and "get <key> <seed> <n>" answer "ok" or "bad <why>".
func child() int {
	ctx := context.Background()
	cfg := ClientConfig{Master: os.Getenv("HMC_KV_MASTER"), SegmentSize: 32 << 20, Heartbeat: 100 * time.Millisecond}
	memory.SetEmulateGPU(os.Getenv(memory.EmulateGPUEnv) == "1") // as cmd/hmc and the C library do
	if os.Getenv("HMC_KV_SEGMENT") == "cuda" {
		cfg.SegmentMemory = memory.NvidiaGPU // emulated where HMC_EMULATE_GPU=1
	}
	c, err := NewClient(ctx, cfg)
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	defer c.Close()
	fmt.Println("READY", c.ID())
	for l := range childtest.ParentSays() {
		var key string
		var seed, n, reps int
		answer := "ok"
		switch {
		case strings.HasPrefix(l, "put"):
			_, _ = fmt.Sscanf(l, "put %s %d %d %d", &key, &seed, &n, &reps)
			if err := c.Put(ctx, key, pattern(seed, n), reps); err != nil {
				answer = "bad " + err.Error()
			}
		case strings.HasPrefix(l, "get"):
			_, _ = fmt.Sscanf(l, "get %s %d %d", &key, &seed, &n)
			got, err := c.Get(ctx, key)
			switch {
			case err != nil:
				answer = "bad " + err.Error()
			case !bytes.Equal(got, pattern(seed, n)):
				answer = "bad bytes differ"
			}
		case strings.HasPrefix(l, "bget"):
			var count int
			_, _ = fmt.Sscanf(l, "bget %s %d %d", &key, &count, &n)
			answer = batchCheck(ctx, c, key, count, n)
		default:
			return 0
		}
		fmt.Println(answer)
	}
	return 0
}

// lender is a pool client in a child process (child) lending a 32 MiB segment: ask sends it a
// line and returns its answer.
type lender struct {
	cmd *exec.Cmd
	ask func(line string) string
}

func startLender(t *testing.T, master string, env ...string) *lender {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	stdin, lines := childtest.Start(t, cmd, 16, append([]string{"HMC_KV_CHILD=client", "HMC_KV_MASTER=" + master}, env...)...)
	t.Cleanup(func() { _ = stdin.Close() })
	select {
	case l := <-lines:
		if !strings.HasPrefix(l, "READY ") {
			t.Fatalf("child said %q", l)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("child did not start")
	}
	return &lender{cmd: cmd, ask: func(l string) string {
		t.Helper()
		if _, err := io.WriteString(stdin, l+"\n"); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-lines:
			return r
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: no answer", l)
		}
		return ""
	}}
}

// batchCheck reads count objects key0, key1, ... of n bytes (seed i) with one BatchGet into
// one buffer, each object scattered over two parts, and says "ok" or "bad <why>".
func batchCheck(ctx context.Context, c *Client, key string, count, n int) string {
	buf := make([]byte, count*(n+64))
	items := make([]Item, count)
	for i := range items {
		b := buf[i*(n+64):]
		items[i] = Item{Key: fmt.Sprint(key, i), Parts: []Span{SpanOf(b[:n/3]), SpanOf(b[n/3+32 : n+64])}}
	}
	sizes, errs := c.BatchGet(ctx, items)
	for i := range items {
		if errs[i] != nil || sizes[i] != uint64(n) {
			return fmt.Sprintf("bad %s: %d bytes, %v", items[i].Key, sizes[i], errs[i])
		}
		b := buf[i*(n+64):]
		got := append(append([]byte(nil), b[:n/3]...), b[n/3+32:n+32]...)
		if !bytes.Equal(got, pattern(i, n)) {
			return fmt.Sprintf("bad %s: bytes differ", items[i].Key)
		}
	}
	return "ok"
}

// Two clients in two processes share one pool: each reads what the other put (from its own
// replica, or over the transfer engine from the other's segment), byte for byte; a lease keeps
// an object from removal; when one client is killed, an object with a replica on the other
// stays readable, and one only it held is gone within the master's ClientTTL — a get of it
// fails typed and never returns bytes.
func TestTwoProcesses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m := NewMaster(MasterConfig{LeaseTTL: 300 * time.Millisecond})
	srv, err := Serve(m, ServerConfig{Addr: "127.0.0.1:0", ClientTTL: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	child := startLender(t, srv.Addr())
	cmd, ask := child.cmd, child.ask
	b, err := NewClient(ctx, ClientConfig{Master: srv.Addr(), SegmentSize: 32 << 20, Heartbeat: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// b's object, two replicas (b's and a's segments); a reads it.
	const n1 = 1<<20 + 3
	if err := b.Put(ctx, "k1", pattern(1, n1), 2); err != nil {
		t.Fatal(err)
	}
	if r := ask(fmt.Sprintf("get k1 1 %d", n1)); r != "ok" {
		t.Fatalf("a's get of k1: %s", r)
	}
	// a's object, one replica in a's segment; b reads it over the transfer engine.
	const n2 = 3<<20 + 5
	if r := ask(fmt.Sprintf("put k2 2 %d 1", n2)); r != "ok" {
		t.Fatalf("a's put of k2: %s", r)
	}
	got, err := b.Get(ctx, "k2")
	if err != nil || !bytes.Equal(got, pattern(2, n2)) {
		t.Fatalf("b's get of k2: %v", err)
	}
	if err := b.Remove(ctx, "k2", false); CodeOf(err) != ObjectHasLease {
		t.Fatalf("remove of a leased object: %v", err)
	}
	if err := b.Put(ctx, "k1", []byte("again"), 1); CodeOf(err) != ObjectAlreadyExists {
		t.Fatalf("a second put of k1: %v", err)
	}
	if ok, err := b.Exist(ctx, "k2"); err != nil || !ok {
		t.Fatalf("exist k2: %v %v", ok, err)
	}
	if n, err := b.Size(ctx, "k2"); err != nil || n != n2 {
		t.Fatalf("size of k2: %d %v", n, err)
	}
	small := make([]byte, 10)
	if _, err := b.GetInto(ctx, "k2", small); CodeOf(err) != InvalidParams {
		t.Fatalf("get into a short buffer: %v", err)
	}
	// Batches: a client lending nothing puts 64 objects, each gathered from two parts, into the
	// others' segments with one call; a reads them back scattered with one call; a missing key
	// fails alone; an upsert rewrites an object a then reads.
	d, err := NewClient(ctx, ClientConfig{Master: srv.Addr(), Heartbeat: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const count, n3 = 64, 16<<10 + 7
	items := make([]Item, count)
	vals := make([][]byte, count)
	for i := range items {
		vals[i] = pattern(i, n3)
		items[i] = Item{Key: fmt.Sprint("b/", i), Parts: []Span{SpanOf(vals[i][:100]), SpanOf(vals[i][100:])}}
	}
	for i, err := range d.BatchPut(ctx, items, PutOptions{Replicas: 1}) {
		if err != nil {
			t.Fatalf("batch put %d: %v", i, err)
		}
	}
	if r := ask(fmt.Sprintf("bget b/ %d %d", count, n3)); r != "ok" {
		t.Fatalf("a's batch get: %s", r)
	}
	got3 := make([]byte, n3)
	sizes, errs := d.BatchGet(ctx, []Item{{Key: "b/3", Parts: []Span{SpanOf(got3)}}, {Key: "nothing", Parts: []Span{SpanOf(got3)}}})
	if errs[0] != nil || sizes[0] != n3 || !bytes.Equal(got3, vals[3]) || CodeOf(errs[1]) != ObjectNotFound || sizes[1] != 0 {
		t.Fatalf("batch get with a missing key: %v %v", sizes, errs)
	}
	if yes, err := d.BatchExist(ctx, []string{"b/0", "nothing", "b/63"}); err != nil || !yes[0] || yes[1] || !yes[2] {
		t.Fatalf("batch exist: %v %v", yes, err)
	}
	time.Sleep(350 * time.Millisecond) // the gets' leases end
	vals[5] = pattern(5, n3)
	for k := range vals[5] {
		vals[5][k] ^= 0x5a
	}
	if errs := d.BatchPut(ctx, []Item{{Key: "b/5", Parts: []Span{SpanOf(vals[5])}}}, PutOptions{Upsert: true}); errs[0] != nil {
		t.Fatalf("upsert: %v", errs[0])
	}
	if got, err := b.Get(ctx, "b/5"); err != nil || !bytes.Equal(got, vals[5]) {
		t.Fatalf("get after upsert: %v", err)
	}
	time.Sleep(350 * time.Millisecond)
	for i, err := range d.BatchRemove(ctx, []string{"b/5", "nothing"}, false) {
		if want := []Code{OK, ObjectNotFound}[i]; CodeOf(err) != want {
			t.Fatalf("batch remove %d: %v", i, err)
		}
	}
	if n, err := d.RemoveByRegex(ctx, "^b/", false); err != nil || n != count-1 {
		t.Fatalf("remove by regex: %d %v", n, err)
	}
	// a dies.
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	got, err = b.Get(ctx, "k1")
	if err != nil || !bytes.Equal(got, pattern(1, n1)) {
		t.Fatalf("k1 after a died (b holds a replica): %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := b.Get(ctx, "k2")
		if err == nil {
			t.Fatalf("a get of an object only a dead client held returned %d bytes", len(got))
		}
		if c := CodeOf(err); c != TransferFail && c != ObjectNotFound {
			t.Fatalf("get of k2 after a died: %v", err)
		}
		if CodeOf(err) == ObjectNotFound && errors.Is(err, status.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("k2 still listed %v after a died: %v", 10*time.Second, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s := m.Stats(); s.Segments != 1 || s.Objects != 1 {
		t.Fatalf("the pool after a died: %+v", s)
	}
}

// Eviction under memory pressure, across processes: a client in another process lends the
// pool's only segment (32 MiB); this process keeps one object leased by reading it every
// 100 ms while another client puts three times the pool's size. Puts succeed by evicting, the
// leased object survives every eviction, every object still listed reads back byte for byte,
// and once no one reads it the leased object is evicted in turn and its gets fail typed.
func TestEvictionUnderPressure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m := NewMaster(MasterConfig{LeaseTTL: 300 * time.Millisecond})
	srv, err := Serve(m, ServerConfig{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	startLender(t, srv.Addr())
	reader, err := NewClient(ctx, ClientConfig{Master: srv.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	writer, err := NewClient(ctx, ClientConfig{Master: srv.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	const size = 1 << 20
	hot := pattern(7, size)
	if err := writer.Put(ctx, "hot", hot, 1); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	readErr := make(chan error, 1)
	go func() { // the reader keeps "hot" leased
		defer close(readErr)
		for {
			got, err := reader.Get(ctx, "hot")
			if err != nil || !bytes.Equal(got, hot) {
				readErr <- fmt.Errorf("get of the leased object: %d bytes, %v", len(got), err)
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	time.Sleep(50 * time.Millisecond) // the first get holds the lease
	for i := 0; i < 96; i++ {
		if err := writer.Put(ctx, fmt.Sprint("cold/", i), pattern(100+i, size), 1); err != nil {
			t.Fatalf("put %d under pressure: %v", i, err)
		}
		if i%16 == 15 {
			time.Sleep(120 * time.Millisecond) // the reader renews its lease in between
		}
	}
	close(stop)
	if err := <-readErr; err != nil {
		t.Fatal(err)
	}
	evicted := 0
	for i := 0; i < 96; i++ {
		got, err := writer.Get(ctx, fmt.Sprint("cold/", i))
		switch {
		case CodeOf(err) == ObjectNotFound:
			evicted++
		case err != nil || !bytes.Equal(got, pattern(100+i, size)):
			t.Fatalf("cold/%d: %d bytes, %v", i, len(got), err)
		}
	}
	if evicted < 60 {
		t.Fatalf("%d of 96 objects evicted from a 32-object pool", evicted)
	}
	time.Sleep(400 * time.Millisecond) // every lease has ended
	for i := 96; i < 200 && m.Exist("hot"); i++ {
		if err := writer.Put(ctx, fmt.Sprint("cold/", i), pattern(100+i, size), 1); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if _, err := writer.Get(ctx, "hot"); CodeOf(err) != ObjectNotFound {
		t.Fatalf("the unleased hot object after more puts: %v", err)
	}
}

// A client lends device memory (a real GPU's, or the emulation's, where a host access to it
// would crash): another process puts objects into it and reads them back, over shared memory
// (device IPC) and over TCP (staging), and the lender reads them (and writes its own) through
// device copies; every byte checked on both sides.
func TestDeviceSegment(t *testing.T) {
	if memory.Probe(memory.NvidiaGPU) != nil {
		transporttest.EmulateGPU(t)
	}
	for _, tc := range []struct {
		name  string
		kinds []transport.ConnType
	}{{"shm", nil}, {"tcp", []transport.ConnType{transport.TCP}}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			m := NewMaster(MasterConfig{LeaseTTL: time.Second})
			srv, err := Serve(m, ServerConfig{Addr: "127.0.0.1:0"})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			ask := startLender(t, srv.Addr(), "HMC_KV_SEGMENT=cuda").ask
			d, err := NewClient(ctx, ClientConfig{Master: srv.Addr(), Kinds: tc.kinds})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			const count, n = 16, 64<<10 + 9
			vals := make([][]byte, count)
			items := make([]Item, count)
			for i := range items {
				vals[i] = pattern(i, n)
				items[i] = Item{Key: fmt.Sprint("dev/", i), Parts: []Span{SpanOf(vals[i][:n/2]), SpanOf(vals[i][n/2:])}}
			}
			for i, err := range d.BatchPut(ctx, items, PutOptions{Replicas: 1}) {
				if err != nil {
					t.Fatalf("put %d into the device segment: %v", i, err)
				}
			}
			runtime.KeepAlive(vals) // items hold only the values' addresses
			for _, i := range []int{0, 7, 15} {
				if r := ask(fmt.Sprintf("get dev/%d %d %d", i, i, n)); r != "ok" {
					t.Fatalf("the lender's get of dev/%d: %s", i, r)
				}
			}
			if r := ask(fmt.Sprintf("bget dev/ %d %d", count, n)); r != "ok" {
				t.Fatalf("the lender's batch get: %s", r)
			}
			if r := ask("put own 5 3000001 1"); r != "ok" {
				t.Fatalf("the lender's put into its device segment: %s", r)
			}
			got, err := d.Get(ctx, "own")
			if err != nil || !bytes.Equal(got, pattern(5, 3000001)) {
				t.Fatalf("get from the device segment: %d bytes, %v", len(got), err)
			}
		})
	}
}

// A client mounts more segments (host memory and a device's, Mooncake's
// allocate_and_mount_segment) and unmounts them: objects with two replicas live in both, are
// read by another client and by the lender (a device copy), survive the device segment's
// unmount from the host copy, and are gone with the last one.
func TestMountSegments(t *testing.T) {
	if memory.Probe(memory.NvidiaGPU) != nil {
		transporttest.EmulateGPU(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m := NewMaster(MasterConfig{LeaseTTL: 100 * time.Millisecond})
	srv, err := Serve(m, ServerConfig{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	a, err := NewClient(ctx, ClientConfig{Master: srv.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	host, err := a.MountSegment(ctx, 8<<20, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	dev, err := a.MountSegment(ctx, 8<<20, "cuda:0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.MountSegment(ctx, 8<<20, "tpu:0"); CodeOf(err) != InvalidParams {
		t.Fatalf("an unknown location: %v", err)
	}
	b, err := NewClient(ctx, ClientConfig{Master: srv.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for i := 0; i < 4; i++ {
		if err := b.Put(ctx, fmt.Sprint("m/", i), pattern(i, 300000+i), 2); err != nil {
			t.Fatal(err)
		}
	}
	if s := m.Stats(); s.Segments != 2 || s.Objects != 4 {
		t.Fatalf("pool: %+v", s)
	}
	for i := 0; i < 4; i++ {
		for _, c := range []*Client{a, b} {
			if got, err := c.Get(ctx, fmt.Sprint("m/", i)); err != nil || !bytes.Equal(got, pattern(i, 300000+i)) {
				t.Fatalf("get m/%d by %s: %v", i, c.ID(), err)
			}
		}
	}
	time.Sleep(150 * time.Millisecond) // the leases end
	if err := a.UnmountSegment(ctx, dev, 0); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Get(ctx, "m/2"); err != nil || !bytes.Equal(got, pattern(2, 300002)) {
		t.Fatalf("get after the device segment left: %v", err)
	}
	if err := a.UnmountSegment(ctx, dev, 0); CodeOf(err) != SegmentNotFound {
		t.Fatalf("a second unmount: %v", err)
	}
	if err := a.UnmountSegment(ctx, host, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, "m/2"); CodeOf(err) != ObjectNotFound {
		t.Fatalf("get after every segment left: %v", err)
	}
	if s := m.Stats(); s.Segments != 0 || s.Objects != 0 || s.Used != 0 {
		t.Fatalf("pool after both unmounts: %+v", s)
	}
}
