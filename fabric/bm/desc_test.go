package bm

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/hmc-go/hmc/fabric/internal/mesh"
	"github.com/hmc-go/hmc/status"
)

// FuzzDecodeDesc: a rank's descriptor from the store is refused with ErrProtocol or accepted,
// never a panic; one accepted names the rank, carries a valid card, fits the strides, has tag
// ops that parse, and reads back the same after encoding again.
func FuzzDecodeDesc(f *testing.F) {
	good, _ := json.Marshal(desc{Card: mesh.Card{Rank: 2, IP: "127.0.0.1", Boot: "b", Addrs: map[string]string{"tcp": "127.0.0.1:7000"}},
		Agent: "127.0.0.1:7001", Tag: "fast", TagOpInfo: "fast:HOST_TCP:slow", Ops: OpHostTCP, DRAM: 4 << 20, HBM: 2 << 20})
	f.Add(good)
	f.Add([]byte(`{"card":{"rank":2,"addrs":{"tcp":"127.0.0.1:1"}},"dram":18446744073709551615}`))
	f.Add([]byte(`{"card":{"rank":2,"addrs":{"tcp":"x"}},"tag_ops":"a:b"}`))
	const dramStride, hbmStride = 8 << 20, 4 << 20
	f.Fuzz(func(t *testing.T, raw []byte) {
		d, err := decodeDesc(raw, 2, dramStride, hbmStride)
		if err != nil {
			if !errors.Is(err, status.ErrProtocol) {
				t.Fatalf("refusal %v is not ErrProtocol", err)
			}
			return
		}
		if d.Card.Rank != 2 || d.Card.Validate() != nil || d.DRAM > dramStride || d.HBM > hbmStride {
			t.Fatalf("accepted %+v", d)
		}
		if _, err := parseTagOps(d.TagOpInfo); err != nil {
			t.Fatalf("accepted tag ops %q: %v", d.TagOpInfo, err)
		}
		enc, _ := json.Marshal(d)
		again, err := decodeDesc(enc, 2, dramStride, hbmStride)
		if err != nil || !reflect.DeepEqual(again, d) {
			t.Fatalf("%+v reads back as %+v (%v)", d, again, err)
		}
	})
}
