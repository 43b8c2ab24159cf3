package hmc

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// layer of each package of the module (STYLE.md §2): imports must point down.
var layers = map[string]int{
	"status": 0, "internal/acceptor": 0, "internal/racebuild": 0, "auth": 1, "auth/authtest": 1, "internal/etcdproc": 0, "internal/etcdtest": 1, "internal/netnstest": 1, "internal/childtest": 1, "internal/sockpair": 0, "internal/peercred": 1, "internal/spinread": 1, "internal/fdconn": 1, "internal/memcopy": 1, "memory": 1,
	"buffer": 2, "ctrl": 2, "coord/store": 2, "coord/store/storetest": 2, "coord/group": 2, "coord/httpmeta": 2,
	"transport": 3, "transport/tcp": 3, "transport/shm": 3, "transport/transporttest": 3, "transport/ucx": 3, "transport/stack": 3,
	"comm": 4, "collective": 5, "metrics": 5, "fabric/internal/gva": 5, "fabric/internal/mesh": 5, "fabric/internal/rpc": 5, "fabric/internal/startup": 5,
	"fabric/trans": 6, "fabric/shmem": 6,
	"fabric/bm": 6, "fabric/kv": 7,
	"": 7, "bench": 7, "cmd/hmc": 8, "capi": 8, "scripts/soakd": 8, "bench/peers/goping": 8,
	"capi/internal/cabi": 8, "capi/internal/hmcapi": 8, "capi/internal/kvapi": 8, "capi/internal/storeapi": 8, "capi/internal/transapi": 8, "capi/internal/smemapi": 8,
}

// outside lists the modules outside this one (and the standard library) that each package may
// import: the dependencies STYLE.md names, each where it is made for the job.
var outside = map[string][]string{
	"internal/etcdproc":   {"go.etcd.io/etcd/", "go.uber.org/zap"},
	"internal/etcdtest":   {"go.uber.org/goleak"},
	"internal/peercred":   {"golang.org/x/sys/"},
	"internal/netnstest":  {"golang.org/x/sys/"},
	"internal/spinread":   {"golang.org/x/sys/"},
	"internal/fdconn":     {"golang.org/x/sys/", "go.uber.org/goleak"},
	"internal/memcopy":    {"golang.org/x/sys/"},
	"memory":              {"golang.org/x/sys/", "github.com/ebitengine/purego"},
	"coord/store":         {"go.etcd.io/etcd/", "go.uber.org/zap", "google.golang.org/grpc"},
	"transport/tcp":       {"golang.org/x/sys/"},
	"transport/shm":       {"golang.org/x/sys/", "github.com/ebitengine/purego"},
	"transport/ucx":       {"golang.org/x/sys/"},
	"fabric/bm":           {"golang.org/x/sys/"},
	"fabric/trans":        {"github.com/redis/go-redis/"}, // Mooncake's redis:// metadata
	"fabric/shmem":        {"golang.org/x/sys/"},
	"fabric/internal/gva": {"golang.org/x/sys/"},
	"bench":               {"gonum.org/v1/plot"},
	"metrics":             {"github.com/prometheus/client_golang/"},
	"cmd/hmc":             {"github.com/spf13/cobra", "github.com/schollz/progressbar/", "golang.org/x/term", "github.com/prometheus/client_golang/"},
}

// TestImportsPointDown checks every package's imports against the layer table and the
// allowlist of outside modules, in the default build and with -tags ucx (whose files import
// more). It fails, never skips, when go list cannot run.
func TestImportsPointDown(t *testing.T) {
	for _, tags := range []string{"", "ucx"} {
		t.Run("tags="+tags, func(t *testing.T) {
			for _, e := range violations(t, tags, layers, outside) {
				t.Error(e)
			}
		})
	}
}

// The check itself catches what it is for: a package importing upwards, and an outside module
// missing from a package's allowlist.
func TestLayerCheckCatches(t *testing.T) {
	l := map[string]int{}
	for k, v := range layers {
		l[k] = v
	}
	l["buffer"] = 0 // now below memory, which it imports
	o := map[string][]string{}
	for k, v := range outside {
		o[k] = v
	}
	delete(o, "bench")
	got := strings.Join(violations(t, "", l, o), "\n")
	if !strings.Contains(got, "buffer (layer 0) imports memory") || !strings.Contains(got, "bench imports gonum.org/v1/plot") {
		t.Fatalf("violations not reported:\n%s", got)
	}
}

func violations(t *testing.T, tags string, layers map[string]int, outside map[string][]string) []string {
	const mod = "github.com/hmc-go/hmc"
	args := []string{"list", "-f", `{{.ImportPath}}:{{join .Imports " "}}`}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	out, err := exec.Command("go", append(args, "./...")...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var bad []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, ":")
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, mod), "/")
		from, ok := layers[rel]
		if !ok {
			bad = append(bad, "package "+rel+" has no layer in layers_test.go")
			continue
		}
		for _, imp := range strings.Fields(imports) {
			if !strings.HasPrefix(imp, mod) {
				if !isStd(imp) && !allowed(outside[rel], imp) {
					bad = append(bad, rel+" imports "+imp+", an outside module not in its allowlist (layers_test.go)")
				}
				continue
			}
			to := strings.TrimPrefix(strings.TrimPrefix(imp, mod), "/")
			l, ok := layers[to]
			if !ok {
				continue
			}
			sameLayerOK := (strings.HasPrefix(rel, "transport/") && to == "transport") ||
				(rel == "transport/stack" && strings.HasPrefix(to, "transport/")) || // builds the set of transports
				(strings.HasPrefix(rel, "coord/") && to == "coord/store" && rel != to) ||
				(strings.HasPrefix(rel, "capi") && strings.HasPrefix(to, "capi/internal/") && rel != to)
			if l > from || (l == from && !sameLayerOK) {
				bad = append(bad, fmt.Sprintf("%s (layer %d) imports %s (layer %d)", rel, from, to, l))
			}
		}
	}
	return bad
}

// isStd says whether an import path is the standard library's (its first element has no dot),
// or cgo's "C".
func isStd(imp string) bool {
	first, _, _ := strings.Cut(imp, "/")
	return !strings.Contains(first, ".")
}

func allowed(prefixes []string, imp string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(imp, p) {
			return true
		}
	}
	return false
}
