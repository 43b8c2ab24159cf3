package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"

	"github.com/hmc-go/hmc/memory"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// WriteJSON writes one JSON object per line.
func WriteJSON(w io.Writer, r Result) error {
	return json.NewEncoder(w).Encode(r)
}

// Table prints results as a fixed-width human table, one row as each result arrives.
type Table struct {
	w      io.Writer
	header bool
}

// NewTable starts a table on w.
func NewTable(w io.Writer) *Table { return &Table{w: w} }

const rowFormat = "%-9s %-4s %-8s %-14s %8s %7s %9s %10s %10s %10s\n"

// Add prints one result row (and the header before the first).
func (t *Table) Add(r Result) {
	if !t.header {
		fmt.Fprintf(t.w, rowFormat, "transport", "op", "mode", "mem", "size", "iters", "GB/s", "p50 µs", "p99 µs", "mean µs")
		t.header = true
	}
	mode := r.Mode
	if mode == "" {
		mode = "-"
	}
	tr := r.Transport
	if r.Route != "" && r.Route != tr {
		tr += ">" + r.Route
	}
	mem := r.Mem
	if r.BufferMem != "" && r.BufferMem != memory.CPU.String() {
		mem = "buf:" + r.BufferMem // the transfer's own memory is the device buffer
	}
	fmt.Fprintf(t.w, rowFormat, tr, r.Op, mode, mem, FormatSize(r.Size), fmt.Sprint(r.Iters),
		fmt.Sprintf("%.3f", r.GBps), fmt.Sprintf("%.1f", r.P50us), fmt.Sprintf("%.1f", r.P99us), fmt.Sprintf("%.1f", r.MeanUs))
}

// Plot writes a PNG chart of bandwidth against size (log2 axis) to path.
func Plot(path, title string, results []Result) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "transfer size (log2 bytes)"
	p.Y.Label.Text = "GB/s (10^9 B/s)"
	pts := make(plotter.XYs, 0, len(results))
	for _, r := range results {
		pts = append(pts, plotter.XY{X: math.Log2(float64(r.Size)), Y: r.GBps})
	}
	line, points, err := plotter.NewLinePoints(pts)
	if err != nil {
		return err
	}
	p.Add(line, points, plotter.NewGrid())
	if len(results) > 0 {
		p.Legend.Add(results[0].Route+" "+results[0].Op, line, points)
	}
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}
