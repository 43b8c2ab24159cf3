package store

import (
	"log/slog"
	"net"
	"strings"
	"time"
)

// nagEvery is how often a client waiting for a store that is not there says so again.
const nagEvery = 2 * time.Second

// nagger logs, at warning level, that a store cannot be reached yet: at the first failed
// attempt, then every nagEvery, until the caller gives up.
type nagger struct {
	log   *slog.Logger
	url   string
	until time.Duration
	start time.Time
	next  time.Time
}

func newNagger(log *slog.Logger, url string, until time.Duration) *nagger {
	now := time.Now()
	return &nagger{log: log, url: url, until: until, start: now, next: now}
}

// failed logs err when due.
func (n *nagger) failed(err error) {
	now := time.Now()
	if now.Before(n.next) {
		return
	}
	n.next = now.Add(nagEvery)
	n.log.Warn("store: not reachable yet, retrying", "url", n.url, "err", err,
		"waited", now.Sub(n.start).Round(time.Millisecond), "gives up after", n.until)
}

// dialProbe dials each endpoint once (300 ms each): nil when one answers, else every dial's
// error ("connection refused" says nobody listens there).
func dialProbe(endpoints []string) error {
	var errs oneLine
	for _, ep := range endpoints {
		c, err := net.DialTimeout("tcp", ep, 300*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return nil
		}
		errs = append(errs, err)
	}
	return oneLine(errs)
}

// oneLine is errors.Join on one line ("a; b"): the errors end up in single-line messages (a C
// caller's last error, a log attribute).
type oneLine []error

func (e oneLine) Error() string {
	s := make([]string, 0, len(e))
	for _, err := range e {
		if err != nil {
			s = append(s, err.Error())
		}
	}
	return strings.Join(s, "; ")
}

func (e oneLine) Unwrap() []error { return e }

// join is errors.Join on one line; nil when every error is nil.
func join(errs ...error) error {
	var out oneLine
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	if out == nil {
		return nil
	}
	return out
}
