package shmem

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/hmc-go/hmc/fabric/internal/mesh"
	"github.com/hmc-go/hmc/status"
)

// FuzzDecodeDesc: a rank's descriptor from Create's allgather is refused with ErrProtocol or
// accepted, never a panic; one accepted names the rank and carries a valid card.
func FuzzDecodeDesc(f *testing.F) {
	good, _ := json.Marshal(desc{Card: mesh.Card{Rank: 1, Boot: "b", Addrs: map[string]string{"tcp": "127.0.0.1:7000", "shm": "@hmc-shm-7001"}}, SHM: true})
	f.Add(good)
	f.Add([]byte(`{"card":{"rank":1,"addrs":{"rdma":"[::1]:9"}}}`))
	f.Add([]byte(`{"card":{"rank":1,"addrs":{"tcp":"127.0.0.1:0"}}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		d, err := decodeDesc(raw, 1)
		if err != nil {
			if !errors.Is(err, status.ErrProtocol) {
				t.Fatalf("refusal %v is not ErrProtocol", err)
			}
			return
		}
		if d.Card.Rank != 1 || d.Card.Validate() != nil {
			t.Fatalf("accepted %+v", d)
		}
	})
}
