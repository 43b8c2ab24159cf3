// Command hmc is HMC-Go's command line: `hmc bench` measures transfers between two processes,
// `hmc store` serves and benchmarks the config store, `hmc info` lists the memory types and transports usable here, `hmc version` prints the build.
package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/spf13/cobra"
)

// version is set with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	stop := profile(os.Getenv("HMC_CPUPROFILE"))
	err := newRoot().Execute()
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "hmc:", err)
		os.Exit(1)
	}
}

// profile writes a CPU profile of this process to path (HMC_CPUPROFILE, for `go tool pprof`;
// a `hmc bench` server child writes path.server), or does nothing when path is empty.
func profile(path string) (stop func()) {
	if path == "" {
		return func() {}
	}
	if len(os.Args) > 2 && os.Args[1] == "bench" && os.Args[2] == "server" {
		path += ".server"
	}
	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hmc: cpu profile:", err)
		return func() {}
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "hmc",
		Short:         "HMC-Go: move bytes between the memories of processes, as fast as the hardware allows",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(benchCmd(), infoCmd(), storeCmd(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "hmc", version) },
	})
	return root
}
