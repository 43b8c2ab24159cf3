package comm

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/ctrl"
	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// TestStreamRingShapes streams between rings of different shapes, in one process: fewer
// receiver slots than sender slots once deadlocked the credit loop.
func TestStreamRingShapes(t *testing.T) {
	shapes := []struct{ sendSlot, recvSize, recvSlot uint64 }{
		{256 << 10, 1 << 20, 512 << 10}, // receiver has 2 slots, sender 4
		{64 << 10, 1 << 20, 1 << 20},    // receiver has 1 slot
		{1 << 20, 1 << 20, 100_000},     // sender chunks bigger than receiver slots
	}
	for _, sh := range shapes {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		rbuf, _ := buffer.New(0, sh.recvSize, memory.CPU)
		recv, err := New(rbuf, Config{Stream: StreamConfig{SlotSize: sh.recvSlot}})
		if err != nil {
			t.Fatal(err)
		}
		if err := recv.InitServer("127.0.0.1", 0, 0, "", transport.TCP); err != nil {
			t.Fatal(err)
		}
		sbuf, _ := buffer.New(0, 1<<20, memory.CPU)
		send, err := New(sbuf, Config{Stream: StreamConfig{SlotSize: sh.sendSlot}})
		if err != nil {
			t.Fatal(err)
		}
		port := transporttestPort(recv.DataAddr(transport.TCP))
		link := CtrlLink{Transport: ctrl.TCP, IP: "127.0.0.1", Port: recv.CtrlAddr().Port}
		if err := send.ConnectTo(ctx, 0, 1, "127.0.0.1", port, link, transport.TCP); err != nil {
			t.Fatal(err)
		}
		src := make([]byte, 5<<20+7)
		transporttest.Fill(src, 5)
		dst := make([]byte, len(src))
		done := make(chan error, 1)
		go func() {
			_, err := recv.Peer("127.0.0.1", 0, transport.TCP).RecvDataFrom(ctx, HostData(dst))
			done <- err
		}()
		if err := send.Peer("127.0.0.1", port, transport.TCP).SendDataTo(ctx, HostData(src)); err != nil {
			t.Fatalf("%+v: %v", sh, err)
		}
		if err := <-done; err != nil || !bytes.Equal(src, dst) {
			t.Fatalf("%+v: %v equal=%v", sh, err, bytes.Equal(src, dst))
		}
		send.Close()
		recv.Close()
		sbuf.Close()
		rbuf.Close()
		cancel()
	}
}

// A stream from device memory keeps the device open, with the ring page-locked, until Close,
// which releases it; after Close no device is opened again.
func TestDeviceStagingLifetime(t *testing.T) {
	transporttest.EmulateGPU(t)
	buf, err := buffer.New(0, 8<<20, memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	c, err := New(buf, Config{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := memory.New(0, memory.NvidiaGPU)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	d, err := m.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	data := DeviceData(d.Ptr(), 1<<20, memory.NvidiaGPU, 0)
	s1, err := c.streams.newStager(data)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := c.streams.newStager(data)
	if err != nil {
		t.Fatal(err)
	}
	if s1.mem != s2.mem || len(c.streams.devs) != 1 || c.streams.devs[devKey{memory.NvidiaGPU, 0}].unpin == nil {
		t.Fatalf("device staging not shared or not locked: %+v", c.streams.devs)
	}
	if err := s1.in(0, 4096, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if len(c.streams.devs) != 0 {
		t.Fatal("Close left devices open")
	}
	if err := s1.in(0, 4096, 0); !errors.Is(err, status.ErrClosed) {
		t.Fatalf("copy through a released device: %v", err)
	}
	if _, err := c.streams.newStager(data); !errors.Is(err, status.ErrClosed) {
		t.Fatalf("stager after Close: %v", err)
	}
}
