package main

import (
	"context"
	"fmt"
	"io"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hmc-go/hmc/metrics"
)

// startMetrics serves Prometheus metrics on addr (--metrics) and returns the collectors, or
// nil when addr is empty. The endpoint ends with ctx or stop.
func startMetrics(ctx context.Context, addr string, log io.Writer) (*metrics.Metrics, func(), error) {
	if addr == "" {
		return nil, func() {}, nil
	}
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		return nil, nil, err
	}
	at, stop, err := metrics.Serve(ctx, addr, reg)
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics: %w", err)
	}
	fmt.Fprintf(log, "metrics at http://%s/metrics\n", at)
	return m, func() { _ = stop() }, nil
}
