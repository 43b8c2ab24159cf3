// Command soakd is the soak of issue #21 item 6 (run by scripts/soak, not in CI): ranks in
// three network namespaces joined by a bridge do random verified put/get/batch/atomic/barrier
// against each other for a while, as separate processes, while links are cut and healed and
// ranks are killed with SIGKILL and restarted; it reports operations, bytes, faults injected,
// errors surfaced, corruptions and hangs. It needs root (namespaces, veth, a bridge).
//
//	soakd run [-ranks 8] [-duration 10m] [-report file.md]
//	soakd rank RANK WORLD STORE_URL IP STATS_FILE   (started by run inside a namespace)
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/hmc-go/hmc/coord/store"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "rank" {
		if err := rankMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "soakd rank:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) < 2 || os.Args[1] != "run" {
		fmt.Fprintln(os.Stderr, "usage: soakd run [-ranks 8] [-duration 10m] [-report file.md]")
		os.Exit(2)
	}
	fl := flag.NewFlagSet("run", flag.ExitOnError)
	ranks := fl.Int("ranks", 8, "rank processes, spread over 3 namespaces")
	dur := fl.Duration("duration", 10*time.Minute, "how long to soak")
	report := fl.String("report", "", "also write the report here (markdown)")
	_ = fl.Parse(os.Args[2:])
	out, err := run(*ranks, *dur)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soakd:", err)
		os.Exit(1)
	}
	fmt.Print(out)
	if *report != "" {
		_ = os.WriteFile(*report, []byte(out), 0o644)
	}
	if strings.Contains(out, "FAILED") {
		os.Exit(1)
	}
}

type ns struct{ name, ip, veth string }

func sh(args ...string) error {
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// network makes a bridge with 10.78.0.1/24 and three namespaces on it (10.78.0.11-13).
func network() ([]ns, func(), error) {
	tag := fmt.Sprintf("%04x", rand.IntN(1<<16))
	br := "hmcbr" + tag
	var made []ns
	cleanup := func() {
		for _, n := range made {
			_ = exec.Command("ip", "netns", "del", n.name).Run()
			_ = exec.Command("ip", "link", "del", n.veth).Run()
		}
		_ = exec.Command("ip", "link", "del", br).Run()
	}
	steps := [][]string{{"ip", "link", "add", br, "type", "bridge"}, {"ip", "addr", "add", "10.78.0.1/24", "dev", br}, {"ip", "link", "set", br, "up"}}
	for _, s := range steps {
		if err := sh(s...); err != nil {
			cleanup()
			return nil, nil, err
		}
	}
	for i := range 3 {
		n := ns{name: fmt.Sprintf("hmcsoak%s%d", tag, i), ip: fmt.Sprintf("10.78.0.%d", 11+i), veth: fmt.Sprintf("vs%s%d", tag, i)}
		made = append(made, n)
		for _, s := range [][]string{
			{"ip", "netns", "add", n.name},
			{"ip", "link", "add", n.veth, "type", "veth", "peer", "name", "eth0", "netns", n.name},
			{"ip", "link", "set", n.veth, "master", br},
			{"ip", "link", "set", n.veth, "up"},
			{"ip", "netns", "exec", n.name, "ip", "addr", "add", n.ip + "/24", "dev", "eth0"},
			{"ip", "netns", "exec", n.name, "ip", "link", "set", "eth0", "up"},
			{"ip", "netns", "exec", n.name, "ip", "link", "set", "lo", "up"},
		} {
			if err := sh(s...); err != nil {
				cleanup()
				return nil, nil, err
			}
		}
	}
	return made, cleanup, nil
}

type proc struct {
	rank  int
	ns    ns
	cmd   *exec.Cmd
	stats []string // stats files of every incarnation
	done  chan error
}

func run(ranks int, dur time.Duration) (string, error) {
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("the soak needs root (network namespaces)")
	}
	nss, cleanup, err := network()
	if err != nil {
		return "", err
	}
	defer cleanup()
	srv, err := store.Listen("tcp://10.78.0.1:0", store.ServerConfig{WorldSize: ranks})
	if err != nil {
		return "", err
	}
	defer srv.Close()
	exe, _ := os.Executable()
	dir, err := os.MkdirTemp("", "hmc-soak")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	procs := make([]*proc, ranks)
	start := func(p *proc) error {
		f := filepath.Join(dir, fmt.Sprintf("rank%d-%d.json", p.rank, len(p.stats)))
		p.stats = append(p.stats, f)
		p.cmd = exec.Command("ip", "netns", "exec", p.ns.name, exe, "rank", fmt.Sprint(p.rank), fmt.Sprint(ranks), srv.URL(), p.ns.ip, f)
		p.cmd.Stderr = os.Stderr
		p.cmd.Env = append(os.Environ(), "UCX_NET_DEVICES=lo")
		if err := p.cmd.Start(); err != nil {
			return err
		}
		p.done = make(chan error, 1)
		go func(c *exec.Cmd, d chan error) { d <- c.Wait() }(p.cmd, p.done)
		return nil
	}
	for r := range ranks {
		procs[r] = &proc{rank: r, ns: nss[r%3]}
		if err := start(procs[r]); err != nil {
			return "", err
		}
	}
	faults := map[string]int{}
	var log []string
	began := time.Now()
	deadline := began.Add(dur)
	// Interrupted (Ctrl-C, SIGTERM), the soak stops early but still stops its ranks, reports
	// and removes its namespaces and bridge.
	stopped := make(chan os.Signal, 1)
	signal.Notify(stopped, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(stopped)
	wait := func(d time.Duration) bool {
		select {
		case <-time.After(d):
			return true
		case <-stopped:
			deadline = time.Now()
			return false
		}
	}
	wait(5 * time.Second) // let them connect and warm up
	for time.Now().Before(deadline.Add(-15 * time.Second)) {
		if !wait(time.Duration(10+rand.IntN(15))*time.Second) || time.Until(deadline) < 15*time.Second {
			break // no fault in the last seconds: a rank restarted then must get going before the stop
		}
		switch rand.IntN(3) {
		case 0: // a namespace cut off from the others for 2-6 s, then healed
			n := nss[rand.IntN(3)]
			d := time.Duration(2+rand.IntN(5)) * time.Second
			if err := sh("ip", "link", "set", n.veth, "down"); err == nil {
				time.Sleep(d)
				_ = sh("ip", "link", "set", n.veth, "up")
				faults["partition"]++
				log = append(log, fmt.Sprintf("%4.0fs partition of %s for %v", time.Since(began).Seconds(), n.name, d))
			}
		case 1: // kill -9 a rank, restart it 2 s later under the same rank
			p := procs[rand.IntN(ranks)]
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
			time.Sleep(2 * time.Second)
			if err := start(p); err != nil {
				return "", err
			}
			faults["kill -9 + restart"]++
			log = append(log, fmt.Sprintf("%4.0fs kill -9 of rank %d, restarted", time.Since(began).Seconds(), p.rank))
		case 2: // both at once: a rank killed while its namespace is cut off
			n := nss[rand.IntN(3)]
			p := procs[rand.IntN(ranks)]
			if err := sh("ip", "link", "set", n.veth, "down"); err == nil {
				_ = p.cmd.Process.Signal(syscall.SIGKILL)
				<-p.done
				time.Sleep(3 * time.Second)
				_ = sh("ip", "link", "set", n.veth, "up")
				if err := start(p); err != nil {
					return "", err
				}
				faults["partition + kill -9"]++
				log = append(log, fmt.Sprintf("%4.0fs partition of %s and kill -9 of rank %d", time.Since(began).Seconds(), n.name, p.rank))
			}
		}
	}
	wait(time.Until(deadline))
	// Stop: SIGTERM, then every rank must exit within 30 s (else it hung).
	hungExit := 0
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			hungExit++
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	}
	return summarize(procs, faults, log, hungExit, time.Since(began))
}

func summarize(procs []*proc, faults map[string]int, log []string, hungExit int, took time.Duration) (string, error) {
	ops, errs, routes := map[string]int{}, map[string]int{}, map[string]int{}
	var bytes uint64
	corrupt, hangs, incarnations, missing, idle := 0, hungExit, 0, 0, 0
	var notes []string
	for _, p := range procs {
		for i, f := range p.stats {
			incarnations++
			b, err := os.ReadFile(f)
			if err != nil {
				if i < len(p.stats)-1 {
					continue // killed with SIGKILL: it wrote nothing, as expected
				}
				missing++
				continue
			}
			var st Stats
			if err := json.Unmarshal(b, &st); err != nil {
				return "", err
			}
			for k, v := range st.Ops {
				ops[k] += v
			}
			for k, v := range st.Errors {
				errs[k] += v
			}
			for k, v := range st.Routes {
				routes[k] += v
			}
			bytes += st.Bytes
			if i == len(p.stats)-1 && st.Ops["put"]+st.Ops["batch"]+st.Ops["atomic"] == 0 {
				idle++ // the last incarnation never got going again after the faults
			}
			corrupt += st.Corruptions
			hangs += st.Hangs
			notes = append(notes, st.Notes...)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "soak: %d ranks in 3 network namespaces, %v, %d rank processes in all\n\n", len(procs), took.Round(time.Second), incarnations)
	fmt.Fprintf(&b, "| measure | value |\n|---|---|\n")
	total := 0
	for _, k := range sortedKeys(ops) {
		fmt.Fprintf(&b, "| %s done (data verified) | %d |\n", k, ops[k])
		total += ops[k]
	}
	fmt.Fprintf(&b, "| operations done | %d |\n| bytes moved | %.1f GiB |\n", total, float64(bytes)/(1<<30))
	for _, k := range sortedKeys(routes) {
		fmt.Fprintf(&b, "| connections: AUTO took %s | %d |\n", k, routes[k])
	}
	for _, k := range sortedKeys(faults) {
		fmt.Fprintf(&b, "| faults: %s | %d |\n", k, faults[k])
	}
	etotal := 0
	for _, k := range sortedKeys(errs) {
		fmt.Fprintf(&b, "| errors: %s | %d |\n", k, errs[k])
		etotal += errs[k]
	}
	fmt.Fprintf(&b, "| errors surfaced | %d |\n| corruptions | %d |\n| hangs | %d |\n", etotal, corrupt, hangs)
	fmt.Fprintf(&b, "| ranks silent at the end (no report) | %d |\n| ranks that did not recover (no data op in their last life) | %d |\n", missing, idle)
	fmt.Fprintf(&b, "\nFaults:\n\n")
	for _, l := range log {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	for _, n := range notes {
		fmt.Fprintf(&b, "\ncorruption: %s", n)
	}
	verdict := "PASSED"
	if corrupt > 0 || hangs > 0 || missing > 0 || idle > 0 || total == 0 {
		verdict = "FAILED"
	}
	fmt.Fprintf(&b, "\n%s (corruptions %d, hangs %d, silent ranks %d, unrecovered ranks %d)\n", verdict, corrupt, hangs, missing, idle)
	return b.String(), nil
}

func sortedKeys(m map[string]int) []string {
	var k []string
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}
