// Package bench is the benchmark engine behind `hmc bench`: a server that serves a ConnBuffer
// and answers verification requests, and a client that sweeps sizes over an operation (put,
// get, lat) or one of upstream uhm_app's modes (uhm, rdma_cpu, g2h2g, serial), and reports
// bandwidth and latency percentiles per size, as a table, JSON lines or a PNG chart.
package bench
