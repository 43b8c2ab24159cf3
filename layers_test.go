package hmc

import (
	"os/exec"
	"strings"
	"testing"
)

// layer of each package of the module (STYLE.md §2): imports must point down.
var layers = map[string]int{
	"status": 0, "internal/acceptor": 0, "internal/peercred": 1, "internal/etcdproc": 0, "internal/etcdtest": 1, "memory": 1, "buffer": 2, "ctrl": 2,
	"coord/store": 2, "coord/store/storetest": 2, "coord/group": 2,
	"transport": 3, "transport/tcp": 3, "transport/shm": 3, "transport/transporttest": 3, "transport/ucx": 3,
	"comm": 4, "collective": 5,
	"": 6, "bench": 6, "cmd/hmc": 7, "capi": 7,
}

func TestImportsPointDown(t *testing.T) {
	const mod = "github.com/hmc-go/hmc"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}:{{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Skipf("go list unavailable: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, ":")
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, mod), "/")
		from, ok := layers[rel]
		if !ok {
			t.Errorf("package %q has no layer in layers_test.go", rel)
			continue
		}
		for _, imp := range strings.Fields(imports) {
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			to := strings.TrimPrefix(strings.TrimPrefix(imp, mod), "/")
			l, ok := layers[to]
			if !ok {
				continue
			}
			sameLayerOK := (strings.HasPrefix(rel, "transport/") && to == "transport") ||
				(strings.HasPrefix(rel, "coord/") && to == "coord/store" && rel != to)
			if l > from || (l == from && !sameLayerOK) {
				t.Errorf("%s (layer %d) imports %s (layer %d)", rel, from, to, l)
			}
		}
	}
}
