package cabi

import (
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/hmc-go/hmc/memory"
)

var (
	logOnce sync.Once
	logger  *slog.Logger
)

// The C library's process reads HMC_EMULATE_GPU=1 once, at load (the library itself reads no
// environment): GPU memory emulated in host memory where no CUDA device exists, for tests.
func init() {
	if os.Getenv(memory.EmulateGPUEnv) == "1" {
		memory.SetEmulateGPU(true)
	}
}

// Logger is where the library's faces log for C and Python callers: standard error, at the
// level HMC_LOG_LEVEL names (debug, info, warn, error or off; default warn), so a caller waiting
// on something that is not there (a metadata store, a peer) hears why without configuring
// anything.
func Logger() *slog.Logger {
	logOnce.Do(func() { logger = newLogger(os.Getenv("HMC_LOG_LEVEL"), os.Stderr) })
	return logger
}

func newLogger(level string, w io.Writer) *slog.Logger {
	var l slog.Level
	switch strings.ToLower(strings.TrimSpace(level)) {
	case "debug":
		l = slog.LevelDebug
	case "info":
		l = slog.LevelInfo
	case "error":
		l = slog.LevelError
	case "off", "none":
		return slog.New(slog.DiscardHandler)
	default:
		l = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})).With("lib", "hmc")
}
