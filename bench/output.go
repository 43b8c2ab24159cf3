package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"

	"github.com/hmc-go/hmc/memory"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
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

// Add prints one result row (and the header before the first). Latency ops (lat, pingpong)
// print no bandwidth; a note above the header says what their times are.
func (t *Table) Add(r Result) {
	if !t.header {
		if latencyOp(r.Op) {
			fmt.Fprintln(t.w, "# lat: time for one blocking put to complete (over tcp and ucx a round trip to the target;"+
				" over shm a copy by this process alone, no round trip); pingpong: half a put-answered-by-put round trip")
		}
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
	gbps := fmt.Sprintf("%.3f", r.GBps)
	if latencyOp(r.Op) {
		gbps = "-"
	}
	fmt.Fprintf(t.w, rowFormat, tr, r.Op, mode, mem, FormatSize(r.Size), fmt.Sprint(r.Iters),
		gbps, fmt.Sprintf("%.1f", r.P50us), fmt.Sprintf("%.1f", r.P99us), fmt.Sprintf("%.1f", r.MeanUs))
}

// TransTable prints the transfer engine's rows (hmc trans bench): per pattern and block size,
// the bandwidth, a batch's time (p50, p99), the median batch's time per block, and the same bytes
// per batch moved as one contiguous transfer in the same run, with the ratio.
type TransTable struct {
	w      io.Writer
	header bool
}

// NewTransTable starts a transfer-engine table on w.
func NewTransTable(w io.Writer) *TransTable { return &TransTable{w: w} }

const transRowFormat = "%-9s %-5s %-10s %-10s %8s %6s %7s %8s %14s %14s %9s %12s %6s\n"

// Add prints one row (and the header before the first).
func (t *TransTable) Add(r Result) {
	if !t.header {
		fmt.Fprintln(t.w, "# batch µs: one batch (all its blocks) submitted and complete; block µs: the median batch over its blocks;"+
			" contiguous: the same bytes per batch as one transfer, same run")
		fmt.Fprintf(t.w, transRowFormat, "transport", "op", "pattern", "mem", "block", "blocks", "iters", "GB/s",
			"batch p50 µs", "batch p99 µs", "block µs", "contig GB/s", "ratio")
		t.header = true
	}
	peer, ratio := "-", "-"
	if r.PeerGBps > 0 {
		peer, ratio = fmt.Sprintf("%.3f", r.PeerGBps), fmt.Sprintf("%.2f", r.Ratio)
	}
	fmt.Fprintf(t.w, transRowFormat, r.Transport, r.Op, r.Mode, r.Mem, FormatSize(r.Size), fmt.Sprint(r.Window), fmt.Sprint(r.Iters),
		fmt.Sprintf("%.3f", r.GBps), fmt.Sprintf("%.1f", r.P50us), fmt.Sprintf("%.1f", r.P99us), fmt.Sprintf("%.2f", r.BlockUs), peer, ratio)
}

// latencyOp says whether op is measured as latency (no bandwidth).
func latencyOp(op string) bool { return op == "lat" || op == "pingpong" }

// Plot writes a PNG chart to path: bandwidth against transfer size, or for latency ops the p50
// and p99 times against size; the size axis is logarithmic, labelled in sizes (8B … 16MiB).
func Plot(path, title string, results []Result) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "transfer size"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = sizeTicks{}
	type series struct {
		name string
		y    func(Result) float64
	}
	lines := []series{{"GB/s", func(r Result) float64 { return r.GBps }}}
	p.Y.Label.Text = "GB/s (10^9 B/s)"
	if len(results) > 0 && latencyOp(results[0].Op) {
		p.Y.Label.Text = "µs"
		lines = []series{{"p50", func(r Result) float64 { return r.P50us }}, {"p99", func(r Result) float64 { return r.P99us }}}
	}
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	for i, sr := range lines {
		pts := make(plotter.XYs, 0, len(results))
		for _, r := range results {
			pts = append(pts, plotter.XY{X: float64(r.Size), Y: sr.y(r)})
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		line.Color = plotutil.Color(i)
		points.Color = plotutil.Color(i)
		p.Add(line, points)
		name := sr.name
		if len(results) > 0 {
			name = results[0].Route + " " + results[0].Op + " " + sr.name
		}
		p.Legend.Add(name, line, points)
	}
	p.Legend.Top, p.Legend.Left = true, true
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

// sizeTicks puts a tick at every power of two in range, labelled as a size ("8B", "4KiB"),
// every fourth one named when the range is wide.
type sizeTicks struct{}

// Ticks implements plot.Ticker.
func (sizeTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	first := math.Floor(math.Log2(math.Max(lo, 1)))
	last := math.Ceil(math.Log2(math.Max(hi, 1)))
	step := 1.0
	if last-first > 12 {
		step = 2
	}
	for e := first; e <= last; e++ {
		v := math.Exp2(e)
		t := plot.Tick{Value: v}
		if math.Mod(e-first, step) == 0 {
			t.Label = FormatSize(uint64(v))
		}
		ticks = append(ticks, t)
	}
	return ticks
}
