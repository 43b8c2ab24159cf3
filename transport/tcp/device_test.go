package tcp

import (
	"testing"

	"github.com/hmc-go/hmc/buffer"
	"github.com/hmc-go/hmc/transport/transporttest"
)

// GPU ConnBuffers over TCP, on either side, go through the staging rings (3 lanes, 2 MiB
// chunks): every byte checked.
func TestDeviceRegionsAreStaged(t *testing.T) {
	const size = 11<<20 + 3
	for _, c := range []struct {
		name          string
		target, local func(testing.TB, uint64) *buffer.ConnBuffer
	}{
		{"device-target", transporttest.DeviceBuf, transporttest.HostBuf},
		{"device-initiator", transporttest.HostBuf, transporttest.DeviceBuf},
		{"device-both", transporttest.DeviceBuf, transporttest.DeviceBuf},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, _ := New(Config{Lanes: 3, ChunkSize: 2 << 20})
			transporttest.DeviceRoundTrip(t, tr, "127.0.0.1:0", c.target(t, size), c.local(t, size))
		})
	}
}
