package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/hmc-go/hmc/comm"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Observed operations and store events show in the scrape, with their labels.
func TestServeScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Observe("put", transport.SHM, "127.0.0.1:2025", 4096, 3*time.Microsecond, nil)
	m.Observe("put", transport.SHM, "127.0.0.1:2025", 4096, 3*time.Microsecond, nil)
	m.Observe("get", transport.TCP, "10.0.0.2:2025", 8, time.Millisecond, fmt.Errorf("x: %w", status.ErrTimeout))
	m.StoreEvent("rank_left", 3)
	m.GroupEvent("member_down", 2)
	addr, stop, err := Serve(context.Background(), "127.0.0.1:0", reg)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`hmc_bytes_total{op="put",peer="127.0.0.1:2025",transport="shm"} 8192`,
		`hmc_operations_total{code="TIMEOUT",op="get",peer="10.0.0.2:2025",transport="tcp"} 1`,
		`hmc_operation_seconds_count{op="put",peer="127.0.0.1:2025",transport="shm"} 2`,
		`hmc_store_events_total{event="rank_left"} 1`,
		`hmc_group_events_total{event="member_down"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + addr + "/metrics"); err == nil {
		t.Fatal("still serving after stop")
	}
	if _, err := New(reg); !errors.Is(err, status.ErrInvalidConfig) {
		t.Fatalf("registering twice: %v", err)
	}
}

var _ comm.Observer = (*Metrics)(nil)
