package trans

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// devSize is each side's device allocation in the device tests.
const devSize = 8 << 20

// devChild is a target engine whose registered memory is a device allocation and a host one
// (HMC_TRANS_CHILD=devtarget): it prints READY <id> <device address> <host address>, then
// answers "dcheck <i> <n> <addr>" (are the n bytes at addr iteration i's pattern?) with "ok <i>"
// or "bad ...", and "dfill <i> <n> <addr>" (write the pattern there) with "filled <i>",
// reading and writing device memory only through device copies.
func devChild() int {
	memory.SetEmulateGPU(os.Getenv(memory.EmulateGPUEnv) == "1")
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.UniqueID = os.Getenv("HMC_TRANS_ID")
	e, err := Create(ctx, os.Getenv("HMC_TRANS_META"), cfg)
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	defer e.Close()
	dev, err := memory.New(0, memory.NvidiaGPU)
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	defer dev.Close()
	b, err := dev.Alloc(devSize)
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	if err := e.Register(uint64(b.Ptr()), devSize); err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	host, err := e.Malloc(devSize)
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	fmt.Println("READY", e.UniqueID(), uint64(b.Ptr()), host)
	for {
		for _, n := range e.Notifies() {
			var i, size int
			var addr uint64
			var answer string
			switch {
			case strings.HasPrefix(n.Msg, "dcheck"):
				if _, err := fmt.Sscanf(n.Msg, "dcheck %d %d %d", &i, &size, &addr); err != nil {
					continue
				}
				got := make([]byte, size)
				answer = "ok " + fmt.Sprint(i)
				if err := memory.Copy(memory.Ptr(memory.AddrOf(got)), memory.Ptr(addr), uint64(size)); err != nil {
					answer = fmt.Sprintf("bad %d: %v", i, err)
				} else if !bytes.Equal(got, pattern(i, size)) {
					answer = fmt.Sprintf("bad %d: bytes differ", i)
				}
			case strings.HasPrefix(n.Msg, "dfill"):
				if _, err := fmt.Sscanf(n.Msg, "dfill %d %d %d", &i, &size, &addr); err != nil {
					continue
				}
				answer = "filled " + fmt.Sprint(i)
				p := pattern(i, size)
				if err := memory.Copy(memory.Ptr(addr), memory.Ptr(memory.AddrOf(p)), uint64(size)); err != nil {
					answer = fmt.Sprintf("bad %d: %v", i, err)
				}
			default:
				continue
			}
			if err := e.SendNotify(ctx, n.Name, Notify{Msg: answer}); err != nil {
				fmt.Println("FAIL answer:", err)
			}
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// pattern is iteration i's n bytes.
func pattern(i, n int) []byte {
	b := make([]byte, n)
	for j := range b {
		b[j] = iterByte(i, j)
	}
	return b
}

// Device memory as source and target of every transfer between two processes, over shared
// memory (device IPC) and TCP (staging rings on both sides): device to device, host to device,
// device to host, reads into device memory, and a scattered batch of KV-sized blocks; every
// byte is checked by the process that owns the memory, through device copies only. Under the
// GPU emulation a device address is not host memory, so a path that touched one from the host
// would crash the test.
func TestDeviceMemoryTwoProcesses(t *testing.T) {
	if memory.Probe(memory.NvidiaGPU) != nil {
		transporttest.EmulateGPU(t)
	}
	dev, err := memory.New(0, memory.NvidiaGPU)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	meta := "P2PHANDSHAKE"
	for _, tc := range []struct {
		name  string
		kinds []transport.ConnType
	}{{"shm", nil}, {"tcp", []transport.ConnType{transport.TCP}}} {
		t.Run(tc.name, func(t *testing.T) {
			id := freeID(t)
			// The child emulates a GPU when this process does (EmulateGPU set HMC_EMULATE_GPU).
			_, l := spawn(t, "HMC_TRANS_CHILD=devtarget", "HMC_TRANS_ID="+id, "HMC_TRANS_META="+meta)
			var rid string
			var rdev, rhost uint64
			if _, err := fmt.Sscanf(l, "READY %s %d %d", &rid, &rdev, &rhost); err != nil {
				t.Fatalf("target said %q", l)
			}
			e := initiator(t, meta, tc.kinds...)
			ctx := testCtx(t)
			local, err := dev.Alloc(devSize)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Free(local)
			lp := uint64(local.Ptr())
			if err := e.Register(lp, devSize); err != nil {
				t.Fatal(err)
			}
			defer e.Deregister(ctx, lp)
			hostBuf := make([]byte, devSize)
			hp := memory.AddrOf(hostBuf)
			if err := e.Register(hp, devSize); err != nil {
				t.Fatal(err)
			}
			defer e.Deregister(ctx, hp)
			check := func(i, n int, addr uint64) {
				t.Helper()
				if err := e.SendNotify(ctx, rid, Notify{Msg: fmt.Sprintf("dcheck %d %d %d", i, n, addr)}); err != nil {
					t.Fatal(err)
				}
				waitNotify(t, e, fmt.Sprintf("ok %d", i))
			}
			fillLocal := func(i, n int, at uint64) {
				t.Helper()
				p := pattern(i, n)
				if err := memory.Copy(memory.Ptr(at), memory.Ptr(memory.AddrOf(p)), uint64(n)); err != nil {
					t.Fatal(err)
				}
			}
			const n = 3<<20 + 5 // crosses the staging rings' 1 MiB chunks, ends unaligned
			// Device to device.
			fillLocal(1, n, lp+7)
			if err := e.Write(ctx, rid, lp+7, rdev+11, n); err != nil {
				t.Fatal(err)
			}
			check(1, n, rdev+11)
			// Host to device.
			copy(hostBuf[3:], pattern(2, n))
			if err := e.Write(ctx, rid, hp+3, rdev+4096, n); err != nil {
				t.Fatal(err)
			}
			check(2, n, rdev+4096)
			// Device to host.
			fillLocal(3, n, lp)
			if err := e.Write(ctx, rid, lp, rhost+1, n); err != nil {
				t.Fatal(err)
			}
			check(3, n, rhost+1)
			// Reads of the peer's device memory into device and host memory.
			if err := e.SendNotify(ctx, rid, Notify{Msg: fmt.Sprintf("dfill 4 %d %d", n, rdev+5)}); err != nil {
				t.Fatal(err)
			}
			waitNotify(t, e, "filled 4")
			if err := e.Read(ctx, rid, lp+1, rdev+5, n); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, n)
			if err := memory.Copy(memory.Ptr(memory.AddrOf(got)), memory.Ptr(lp+1), n); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, pattern(4, n)) {
				t.Fatal("read of the peer's device memory into device memory: bytes differ")
			}
			clear(hostBuf)
			if err := e.Read(ctx, rid, hp, rdev+5, n); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(hostBuf[:n], pattern(4, n)) {
				t.Fatal("read of the peer's device memory into host memory: bytes differ")
			}
			// A KV-shaped batch: 64 scattered 16 KiB blocks, device to device, in one call.
			const blk, blocks = 16 << 10, 64
			fillLocal(5, blk*blocks*2, lp)
			var locals, remotes, sizes []uint64
			for k := range blocks {
				locals = append(locals, lp+uint64(2*k*blk)) // every other block
				remotes = append(remotes, rdev+uint64(k*blk))
				sizes = append(sizes, blk)
			}
			if err := e.BatchWrite(ctx, rid, locals, remotes, sizes); err != nil {
				t.Fatal(err)
			}
			want := pattern(5, blk*blocks*2)
			var packed []byte
			for k := range blocks {
				packed = append(packed, want[2*k*blk:(2*k+1)*blk]...)
			}
			staged := make([]byte, len(packed))
			if err := e.Read(ctx, rid, hp, rdev, uint64(len(packed))); err != nil {
				t.Fatal(err)
			}
			copy(staged, hostBuf)
			if !bytes.Equal(staged, packed) {
				t.Fatal("a scattered device batch: bytes differ")
			}
			// The same blocks from host memory into the peer's device memory (over TCP, one
			// vector message for many blocks; the target stages device pieces), and back.
			copy(hostBuf, want)
			if err := e.BatchWrite(ctx, rid, locals2(hp, blk, blocks), remotes, sizes); err != nil {
				t.Fatal(err)
			}
			check6 := make([]byte, len(packed))
			if err := e.Read(ctx, rid, memory.AddrOf(check6), rdev, uint64(len(check6))); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(check6, packed) {
				t.Fatal("a scattered host-to-device batch: bytes differ")
			}
		})
	}
}

// locals2 is blocks addresses from base, every other block of blk bytes.
func locals2(base uint64, blk, blocks int) []uint64 {
	out := make([]uint64, blocks)
	for k := range out {
		out[k] = base + uint64(2*k*blk)
	}
	return out
}
