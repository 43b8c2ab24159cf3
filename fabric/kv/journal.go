package kv

import "sort"

// entry is one change of a leader master's state, in the order the leader made it: a standby
// that applies a snapshot and then every later entry holds the same segments and objects (the
// soft state, leases and recency, is not logged: a new leader starts every lease afresh).
type entry struct {
	// Removed are the keys removed by the change (removals, evictions, revoked or timed-out
	// puts, objects left without a replica), applied first.
	Removed []string `json:"rm,omitempty"`
	// Op is the change: "mount", "unmount", "down" (a client gone), "start" (puts placed),
	// "end" (puts made visible); "" when it only removed.
	Op      string   `json:"op,omitempty"`
	Segment Segment  `json:"seg"`
	Client  string   `json:"client,omitempty"`
	Objects []placed `json:"objs,omitempty"`
	Keys    []string `json:"keys,omitempty"`
}

// placed is an object as logged: its replicas and, in snapshots, whether it is complete.
type placed struct {
	Key      string   `json:"k"`
	Size     uint64   `json:"n"`
	Replicas []Buffer `json:"r"`
	Owner    string   `json:"o,omitempty"` // the writer of an object not yet complete
	Writer   string   `json:"w,omitempty"`
	Complete bool     `json:"c,omitempty"`
}

// snapshot is a master's segments and objects.
type snapshot struct {
	Seq      int64     `json:"seq"` // the last log entry it includes
	Segments []Segment `json:"segs"`
	Objects  []placed  `json:"objs"`
}

// setJournal makes the master collect the keys it removes for its log.
func (m *Master) setJournal(on bool) {
	m.mu.Lock()
	m.journal, m.removed = on, nil
	m.mu.Unlock()
}

// drainRemoved returns the keys removed since the last call.
func (m *Master) drainRemoved() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.removed
	m.removed = nil
	return r
}

// snapshot returns the master's segments and objects.
func (m *Master) snapshot() snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	var s snapshot
	for _, seg := range m.segments {
		s.Segments = append(s.Segments, seg.seg)
	}
	sort.Slice(s.Segments, func(i, j int) bool { return s.Segments[i].Name < s.Segments[j].Name })
	for _, o := range m.objects {
		s.Objects = append(s.Objects, placed{Key: o.key, Size: o.size, Replicas: o.replicas, Owner: o.owner, Writer: o.writer, Complete: o.complete})
	}
	return s
}

// restore loads a snapshot into an empty master.
func (m *Master) restore(s snapshot) {
	for _, seg := range s.Segments {
		m.apply(entry{Op: "mount", Segment: seg})
	}
	for _, o := range s.Objects {
		m.apply(entry{Op: "start", Client: o.Owner, Objects: []placed{o}})
		if o.Complete {
			m.apply(entry{Op: "end", Client: o.Writer, Keys: []string{o.Key}})
		}
	}
}

// apply makes a change the leader logged. It never fails: a change that does not fit (a
// segment or range the log does not explain) is skipped, leaving the pool smaller, never
// overlapping.
func (m *Master) apply(e entry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Now()
	for _, k := range e.Removed {
		if o, ok := m.objects[k]; ok {
			m.removeLocked(o)
		}
	}
	switch e.Op {
	case "mount":
		_ = m.mountLocked(e.Segment) // one mounted already, or not valid: skipped
	case "unmount":
		if _, ok := m.segments[e.Segment.Name]; ok {
			m.dropSegmentLocked(e.Segment.Name)
		}
	case "down":
		m.clientDownLocked(e.Client)
	case "start":
		for _, p := range e.Objects {
			if o, ok := m.objects[p.Key]; ok {
				m.removeLocked(o)
			}
			if !m.reserveLocked(p) {
				continue
			}
			o := &object{key: p.Key, size: p.Size, replicas: append([]Buffer(nil), p.Replicas...), owner: e.Client, started: now}
			m.objects[p.Key], m.pending[o] = o, true
		}
	case "end":
		for _, k := range e.Keys {
			if o, ok := m.objects[k]; ok && !o.complete {
				m.completeLocked(o, e.Client)
			}
		}
	}
	if m.journal {
		m.removed = nil // a replay's removals are the log's, not new ones
	}
}

// reserveLocked takes an object's replica ranges in their segments, all or none.
func (m *Master) reserveLocked(p placed) bool {
	for i, b := range p.Replicas {
		s, ok := m.segments[b.Segment]
		if ok && b.Size == p.Size && b.Addr >= s.seg.Base && s.alloc.reserve(b.Addr-s.seg.Base, b.Size) {
			continue
		}
		m.releaseLocked(p.Replicas[:i])
		return false
	}
	m.used += uint64(len(p.Replicas)) * roundUp(p.Size)
	return len(p.Replicas) > 0
}

// graceLeases leases every object for LeaseTTL from now: a new leader does not know which
// objects its predecessor leased to readers still reading.
func (m *Master) graceLeases() {
	m.mu.Lock()
	defer m.mu.Unlock()
	until := m.cfg.Now().Add(m.cfg.LeaseTTL)
	for _, o := range m.objects {
		o.lease = until
	}
}

// clients are the clients the master knows (segments and puts under way).
func (m *Master) clients() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	for _, s := range m.segments {
		seen[s.seg.Client] = true
	}
	for o := range m.pending {
		seen[o.owner] = true
	}
	var out []string
	for c := range seen {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}
