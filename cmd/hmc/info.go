package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/transport"
	"github.com/hmc-go/hmc/transport/shm"
	"github.com/hmc-go/hmc/transport/ucx"
)

func infoCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "info",
		Short: "List the memory types and transports available here, and why the others are not",
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 4, 0, 2, ' ', 0)
			fmt.Fprintln(w, "MEMORY TYPE\tVALUE\tSTATUS")
			for _, t := range memory.Types {
				if t == memory.Default {
					m, err := memory.New(0, t)
					if err == nil {
						fmt.Fprintf(w, "%v\t%d\tresolves to %v\n", t, int(t), m.Type())
						_ = m.Close()
					}
					continue
				}
				fmt.Fprintf(w, "%v\t%d\t%s\n", t, int(t), availability(memory.Probe(t)))
			}
			fmt.Fprintln(w, "\nTRANSPORT\tVALUE\tSTATUS")
			for _, ct := range []transport.ConnType{transport.TCP, transport.SHM, transport.UCX, transport.RDMA, transport.AUTO} {
				fmt.Fprintf(w, "%v\t%d\t%s\n", ct, int(ct), transportStatus(ct))
			}
			fmt.Fprintln(w, "\nDEVICE MEMORY\tHOW IT MOVES")
			fmt.Fprintln(w, "classification\tthe driver's pointer attributes (CUDA, HIP), loaded only in processes that use it")
			fmt.Fprintln(w, "shm\tone device copy into the peer's device memory (CUDA/HIP IPC handle) or shared host memory")
			fmt.Fprintln(w, "tcp\tthrough pinned staging rings on both sides, copies overlapping the wire")
			fmt.Fprintf(w, "ucx\t%s\n", ucx.DeviceMemory())
			if rs, err := ucx.Resources(); err == nil {
				fmt.Fprintln(w, "\nUCX TRANSPORT\tDEVICE\tMEMORY DOMAIN")
				for _, r := range rs {
					fmt.Fprintf(w, "%s\t%s\t%s\n", r.Transport, r.Device, r.MD)
				}
			}
			return w.Flush()
		},
	}
}

func availability(err error) string {
	if err == nil {
		return "available"
	}
	return "unavailable: " + err.Error()
}

func transportStatus(ct transport.ConnType) string {
	switch ct {
	case transport.TCP:
		return "available (pure Go, multi-lane)"
	case transport.AUTO:
		return "available: shm when the peer's address is one of this host's and its server answers with this kernel's boot id, else tcp"
	case transport.SHM:
		if _, err := shm.BootID(); err != nil {
			return "unavailable: " + err.Error()
		}
		return "available (same host: sealed memfd passed over a Unix socket, initiator-only copies)"
	case transport.UCX:
		if _, err := ucx.New(ucx.Config{}); err != nil {
			return "unavailable: " + err.Error()
		}
		if _, err := ucx.Resources(); err != nil {
			return "unavailable: " + err.Error()
		}
		return "available (libucp; UCX_TLS selects its transports, listed below)"
	case transport.RDMA:
		if _, err := ucx.NewRDMA(ucx.Config{}); err != nil {
			return "unavailable: " + err.Error()
		}
		return "available (UCX on rc/ud/dc)"
	}
	return "unknown"
}
