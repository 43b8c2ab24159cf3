// Command hmc is HMC-Go's command line: `hmc bench` measures transfers between two processes,
// `hmc store` serves and benchmarks the config store, `hmc info` lists the memory types and transports usable here, `hmc version` prints the build.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"runtime/trace"
	"strings"

	"github.com/spf13/cobra"

	"github.com/hmc-go/hmc/memory"
	"github.com/hmc-go/hmc/transport/ucx"
)

// version, when set with -ldflags "-X main.version=...", overrides what the build info says.
var version = ""

// buildVersion says which build this is: the -ldflags version if set, else the module version
// (a tag with `go install ...@v1.2.3`), the VCS commit and whether the tree was modified, the Go
// version, and the ucx tag.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(no build info)"
	}
	v := version
	if v == "" {
		v = bi.Main.Version
	}
	var rev, dirty, tags string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
			if len(rev) > 12 {
				rev = rev[:12]
			}
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+modified"
			}
		case "-tags":
			tags = " tags=" + s.Value
		}
	}
	if rev != "" && !strings.Contains(v, rev) { // a pseudo-version names the commit already
		v += " " + rev
	}
	if rev != "" && !strings.HasSuffix(v, "+dirty") {
		v += dirty
	} else if rev == "" && v == "(devel)" {
		v += " (no VCS revision: built with -buildvcs=false; go install -buildvcs=auto ./cmd/hmc stamps it)"
	}
	return v + " " + bi.GoVersion + tags
}

func main() {
	// A fault inside UCX (ucx builds) must reach Go's handler, which prints the Go stacks.
	if err := ucx.ExecWithoutErrorSignals(); err != nil {
		fmt.Fprintln(os.Stderr, "hmc:", err)
	}
	if os.Getenv(memory.EmulateGPUEnv) == "1" { // tests and CI without a GPU
		memory.SetEmulateGPU(true)
	}
	stop := profile(os.Getenv("HMC_CPUPROFILE"))
	stopTrace := traceTo(os.Getenv("HMC_TRACE"))
	stopAllocs := allocsTo(os.Getenv("HMC_MEMPROFILE"))
	err := newRoot().Execute()
	stopAllocs()
	stopTrace()
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "hmc:", err)
		os.Exit(1)
	}
}

// profile writes a CPU profile of this process to path (HMC_CPUPROFILE, for `go tool pprof`),
// or does nothing when path is empty.
func profile(path string) (stop func()) {
	return diagnose("cpu profile", path, pprof.StartCPUProfile, pprof.StopCPUProfile)
}

// traceTo writes a Go execution trace of this process to path (HMC_TRACE, for `go tool trace`:
// which goroutine ran, blocked or entered C when, and where the runtime took a P away), or
// does nothing when path is empty.
func traceTo(path string) (stop func()) {
	return diagnose("trace", path, trace.Start, trace.Stop)
}

// allocsTo writes an allocation profile of this process to path when it ends (HMC_MEMPROFILE,
// for `go tool pprof -sample_index=alloc_objects`: what allocated how often), sampling one
// allocation per 4 KiB allocated, or does nothing when path is empty.
func allocsTo(path string) (stop func()) {
	var out io.Writer
	return diagnose("allocation profile", path, func(w io.Writer) error {
		runtime.MemProfileRate = 4096
		out = w
		return nil
	}, func() {
		if err := pprof.Lookup("allocs").WriteTo(out, 0); err != nil {
			fmt.Fprintln(os.Stderr, "hmc: allocation profile:", err)
		}
	})
}

// isServerChild says whether args run the passive side of a benchmark (`hmc bench server`,
// `hmc bm serve`, `hmc shmem serve`, `hmc trans bench --mode target`), which benchmarks start as children.
func isServerChild(args []string) bool {
	if len(args) < 3 {
		return false
	}
	switch {
	case args[1] == "bench" && args[2] == "server", args[1] == "bm" && args[2] == "serve", args[1] == "shmem" && args[2] == "serve":
		return true
	case args[1] == "trans":
		for i, a := range args {
			if a == "--mode=target" || a == "--mode" && i+1 < len(args) && args[i+1] == "target" {
				return true
			}
		}
	}
	return false
}

// diagnose starts a diagnostic writing to path (a benchmark's server child writes
// path.server) and returns what ends it; nothing when path is empty.
func diagnose(what, path string, start func(io.Writer) error, end func()) (stop func()) {
	if path == "" {
		return func() {}
	}
	if isServerChild(os.Args) {
		path += ".server"
	}
	f, err := os.Create(path)
	if err == nil {
		err = start(f)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "hmc: %s: %v\n", what, err)
		if f != nil {
			_ = f.Close()
		}
		return func() {}
	}
	return func() { end(); _ = f.Close() }
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "hmc",
		Short:         "HMC-Go: move bytes between the memories of processes, as fast as the hardware allows",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(benchCmd(), bmCmd(), transCmd(), kvCmd(), shmemCmd(), infoCmd(), storeCmd(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "hmc", buildVersion()) },
	})
	return root
}
