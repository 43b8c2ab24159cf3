// Package metrics exports HMC-Go's activity to Prometheus: operations, bytes and latency by
// operation, transport and peer (it is a comm.Observer), config-store and group events, with an
// opt-in HTTP endpoint that serves them. Nothing is collected unless a program asks for it.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// Metrics holds the collectors. Its methods are safe for concurrent use.
type Metrics struct {
	ops   *prometheus.CounterVec
	bytes *prometheus.CounterVec
	lat   *prometheus.HistogramVec
	store *prometheus.CounterVec
	group *prometheus.CounterVec
}

// New makes the collectors and registers them with reg (prometheus.NewRegistry() for a
// registry of one's own, prometheus.DefaultRegisterer for the process's).
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "hmc", Name: "operations_total",
			Help: "Operations ended, by operation, transport, peer and status code (SUCCESS for none)."},
			[]string{"op", "transport", "peer", "code"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "hmc", Name: "bytes_total",
			Help: "Bytes moved by successful operations, by operation, transport and peer."},
			[]string{"op", "transport", "peer"}),
		lat: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "hmc", Name: "operation_seconds",
			Help:    "Time from an operation's start to its end, by operation, transport and peer.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12)}, // 1 µs … ~4 s
			[]string{"op", "transport", "peer"}),
		store: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "hmc", Name: "store_events_total",
			Help: "Config-store server events: rank_joined, rank_left (closed its link), rank_lost (link lost), refused."},
			[]string{"event"}),
		group: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "hmc", Name: "group_events_total",
			Help: "Group engine events: member_down, view (a new membership version)."},
			[]string{"event"}),
	}
	for _, c := range []prometheus.Collector{m.ops, m.bytes, m.lat, m.store, m.group} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w: %w", status.ErrInvalidConfig, err)
		}
	}
	return m, nil
}

// Observe counts one operation (comm.Observer).
func (m *Metrics) Observe(op string, route transport.ConnType, peer string, n uint64, d time.Duration, err error) {
	tr := route.String()
	m.ops.WithLabelValues(op, tr, peer, status.CodeOf(err).String()).Inc()
	if err == nil {
		m.bytes.WithLabelValues(op, tr, peer).Add(float64(n))
	}
	m.lat.WithLabelValues(op, tr, peer).Observe(d.Seconds())
}

// StoreEvent counts one config-store server event (store.ServerConfig.OnEvent).
func (m *Metrics) StoreEvent(event string, _ int) { m.store.WithLabelValues(event).Inc() }

// GroupEvent counts one group-engine event (group.Config.OnEvent).
func (m *Metrics) GroupEvent(event string, _ int) { m.group.WithLabelValues(event).Inc() }

// Serve serves g's metrics at http://addr/metrics until ctx ends or stop is called, and returns
// the address it listens on (addr may have port 0).
func Serve(ctx context.Context, addr string, g prometheus.Gatherer) (string, func() error, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("metrics: listen %s: %w: %w", addr, status.ErrInvalidConfig, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { // owned by Serve's caller through stop
		defer close(done)
		_ = srv.Serve(l) // ends with ErrServerClosed when stopped
	}()
	stopped := make(chan struct{})
	go func() { // ends the server with ctx; owned likewise
		select {
		case <-ctx.Done():
			_ = srv.Close()
		case <-stopped:
		}
	}()
	stop := func() error {
		select {
		case <-stopped:
			return nil
		default:
			close(stopped)
		}
		err := srv.Close()
		<-done
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		return err
	}
	return l.Addr().String(), stop, nil
}
