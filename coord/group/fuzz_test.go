package group

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"github.com/hmc-go/hmc/coord/store"
)

// FuzzDecodeMembers: a view from the store is refused or decoded, never a panic; the members of
// one accepted are sorted, distinct and in range (the engine looks ranks up by binary search)
// and encode to the same view again.
func FuzzDecodeMembers(f *testing.F) {
	f.Add(encodeMembers([]int{0, 1, 5}))
	f.Add([]byte("m:"))
	f.Add([]byte("m:3,1"))
	f.Add([]byte("m:1,1"))
	f.Add([]byte("m:01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMembers(b)
		if err != nil {
			if !errors.Is(err, store.ErrInvalidMessage) {
				t.Fatalf("refusal %v is not ErrInvalidMessage", err)
			}
			return
		}
		for i, r := range m {
			if r < 0 || r >= store.MaxWorldSize || i > 0 && m[i-1] >= r {
				t.Fatalf("%q decodes to %v", b, m)
			}
		}
		again, err := decodeMembers(encodeMembers(m))
		if err != nil || !slices.Equal(again, m) {
			t.Fatalf("%v encodes to a view read back as %v (%v)", m, again, err)
		}
	})
}

// FuzzParseRecords: an allgather's appended records are split by rank, or refused with
// ErrInvalidMessage, never a panic; one accepted has exactly one record per member, each inside
// the input.
func FuzzParseRecords(f *testing.F) {
	rec := func(rank int, data string) []byte {
		b := binary.LittleEndian.AppendUint32(nil, uint32(rank))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(data)))
		return append(b, data...)
	}
	f.Add(slices.Concat(rec(5, "c"), rec(0, "a"), rec(2, "bb")))
	f.Add(slices.Concat(rec(0, "a"), rec(0, "a")))
	f.Add(rec(0, "a")[:9])
	f.Add(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, 2), 0xffffffff))
	c := &collective{members: []int{0, 2, 5}}
	f.Fuzz(func(t *testing.T, all []byte) {
		out, err := c.parse(all)
		if err != nil {
			if !errors.Is(err, store.ErrInvalidMessage) {
				t.Fatalf("refusal %v is not ErrInvalidMessage", err)
			}
			return
		}
		if len(out) != len(c.members) {
			t.Fatalf("%d records for %d members", len(out), len(c.members))
		}
		total := 0
		for _, d := range out {
			if d == nil || !bytes.Contains(all, d) {
				t.Fatalf("record %q is not in the input", d)
			}
			total += 8 + len(d)
		}
		if total != len(all) {
			t.Fatalf("records of %d bytes from %d", total, len(all))
		}
	})
}
