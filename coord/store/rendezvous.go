package store

import (
	"context"
	"fmt"
	"time"
)

// Rendezvous is an optional capability of a Client: n participants meet under a key prefix,
// each writing only its own key, so that no two of them contend for one key. The group
// engine's barrier and allgather use it when the store offers it (AsRendezvous); on etcd a
// shared counter costs every contender a retried transaction, O(n²) in all, while own keys
// cost one write each. The embedded server does not offer it: its Add is one round trip with
// no retries, faster than any scheme built on top.
type Rendezvous interface {
	// Arrive stores value as participant id (0 ≤ id < n) of the meeting under prefix (a key
	// prefix that no other meeting's prefix extends, e.g. ending in '/') and returns at once.
	// The participant whose arrival completes the meeting stores under done the
	// concatenation of all n values in id order; whoever waits for done (Get) sees it. More
	// than one participant may write done, always with the same value.
	Arrive(ctx context.Context, prefix string, id, n int, value []byte, done string) error
	// Await is Get with a wait for the key dir+name, served from one watch of dir that the
	// client keeps for later calls (a meeting's done keys share a dir). Unlike Get it is not
	// a linearizable read: a key removed a moment ago may still be returned. Meant for keys
	// written once, such as done keys.
	Await(ctx context.Context, dir, name string, wait time.Duration) ([]byte, error)
	// Arrived returns the ids that have arrived at the meeting under prefix, ascending.
	Arrived(ctx context.Context, prefix string) ([]int, error)
	// RemoveMeeting deletes the meeting's participant keys (not done; Remove that).
	RemoveMeeting(ctx context.Context, prefix string) error
}

// MaxParticipants is the most participants one Rendezvous meeting takes.
const MaxParticipants = 1 << 16

// AsRendezvous returns c's Rendezvous, seen through Prefixed views, if its backend has one.
func AsRendezvous(c Client) (Rendezvous, bool) {
	switch v := c.(type) {
	case *prefixed:
		r, ok := AsRendezvous(v.Client)
		if !ok {
			return nil, false
		}
		return prefixedRendezvous{r: r, prefix: v.prefix}, true
	case Rendezvous:
		return v, true
	}
	return nil, false
}

type prefixedRendezvous struct {
	r      Rendezvous
	prefix string
}

func (p prefixedRendezvous) Arrive(ctx context.Context, prefix string, id, n int, value []byte, done string) error {
	return p.r.Arrive(ctx, p.prefix+prefix, id, n, value, p.prefix+done)
}

func (p prefixedRendezvous) Await(ctx context.Context, dir, name string, wait time.Duration) ([]byte, error) {
	return p.r.Await(ctx, p.prefix+dir, name, wait)
}

func (p prefixedRendezvous) Arrived(ctx context.Context, prefix string) ([]int, error) {
	return p.r.Arrived(ctx, p.prefix+prefix)
}

func (p prefixedRendezvous) RemoveMeeting(ctx context.Context, prefix string) error {
	return p.r.RemoveMeeting(ctx, p.prefix+prefix)
}

// participantKey is the key of participant id under prefix: fixed width, so that key order is
// id order.
func participantKey(prefix string, id int) string { return fmt.Sprintf("%s%05d", prefix, id) }

// checkMeeting validates Arrive's arguments.
func checkMeeting(prefix string, id, n int, value []byte, done string) error {
	if n < 1 || n > MaxParticipants || id < 0 || id >= n {
		return fmt.Errorf("%w: participant %d of %d (1..%d participants)", ErrInvalidKey, id, n, MaxParticipants)
	}
	if err := checkKey(prefix); err != nil {
		return err
	}
	if err := checkKey(participantKey(prefix, id)); err != nil {
		return err
	}
	if err := checkKey(done); err != nil {
		return err
	}
	return checkValue(value)
}
