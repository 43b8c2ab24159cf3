// Command hmc is HMC-Go's command line: `hmc bench` measures transfers between two processes,
// `hmc store` serves and benchmarks the config store, `hmc info` lists the memory types and transports usable here, `hmc version` prints the build.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// version is set with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "hmc:", err)
		os.Exit(1)
	}
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
