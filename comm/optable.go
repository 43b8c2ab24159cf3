package comm

import "github.com/hmc-go/hmc/transport"

// opRing is how many recent operation ids opTable keeps in its ring.
const opRing = 1024

// opTable holds the operations posted and not yet waited for, by id. Ids are handed out in
// increasing order and mostly waited for soon after, so they live in a ring indexed by id (no
// hashing, nothing allocated per operation); an id whose slot still holds an older operation
// nobody waited for goes to a map. Not safe for concurrent use (the Communicator's mu guards it).
type opTable struct {
	ring  [opRing]opSlot
	spill map[uint64]*transport.Op
	n     int
}

type opSlot struct {
	id uint64
	op *transport.Op // nil: free
}

func (t *opTable) add(id uint64, op *transport.Op) {
	if s := &t.ring[id%opRing]; s.op == nil {
		*s = opSlot{id: id, op: op}
	} else {
		if t.spill == nil {
			t.spill = make(map[uint64]*transport.Op)
		}
		t.spill[id] = op
	}
	t.n++
}

// take removes the operation id and returns it, if it is there.
func (t *opTable) take(id uint64) (*transport.Op, bool) {
	if s := &t.ring[id%opRing]; s.op != nil && s.id == id {
		op := s.op
		*s = opSlot{}
		t.n--
		return op, true
	}
	if op, ok := t.spill[id]; ok {
		delete(t.spill, id)
		t.n--
		return op, true
	}
	return nil, false
}

// len returns the number of operations held.
func (t *opTable) len() int { return t.n }
