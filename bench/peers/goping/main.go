// Command goping is bench/peers/ctrl_pingpong.c in Go: the same frames over the same blocking
// socket, one goroutine per process calling read(2) and write(2) through package syscall, with
// nothing else (no framing library, no netpoller, no locks). bench/compare-ctrl.sh measures it
// beside the C peer and hmc's ctrl: the floor of a Go control plane on the same socket, what the
// runtime's system-call entry and exit cost over C.
//
//	goping server uds PATH | tcp PORT        echo frames until the client hangs up
//	goping client uds PATH | tcp PORT ITERS  print "p50_us P mean_us M"
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintf(os.Stderr, "usage: %s server|client uds PATH|tcp PORT [ITERS]\n", os.Args[0])
		os.Exit(2)
	}
	server := os.Args[1] == "server"
	fd, err := sock(os.Args[2], os.Args[3], server)
	if err != nil {
		fmt.Fprintln(os.Stderr, "goping:", err)
		os.Exit(1)
	}
	var f [16]byte
	if server {
		for full(fd, f[:], false) == nil && full(fd, f[:], true) == nil {
		}
		return
	}
	iters := 10000
	if len(os.Args) > 4 {
		iters, _ = strconv.Atoi(os.Args[4])
	}
	const warm = 200
	lat := make([]float64, iters)
	var sum float64
	f[0], f[4] = 1, 8 // TypeInt, length 8
	for i := -warm; i < iters; i++ {
		t0 := time.Now()
		binary.LittleEndian.PutUint64(f[8:], uint64(i))
		err := full(fd, f[:], true)
		if err == nil {
			err = full(fd, f[:], false)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "goping:", err)
			os.Exit(1)
		}
		if i >= 0 {
			lat[i] = float64(time.Since(t0).Nanoseconds()) / 1e3
			sum += lat[i]
		}
	}
	slices.Sort(lat)
	fmt.Printf("p50_us %.2f mean_us %.2f\n", lat[iters/2], sum/float64(iters))
}

// full reads or writes all of b.
func full(fd int, b []byte, write bool) error {
	for len(b) > 0 {
		var n int
		var err error
		if write {
			n, err = syscall.Write(fd, b)
		} else {
			n, err = syscall.Read(fd, b)
		}
		if err != nil {
			return err
		}
		if n <= 0 {
			return fmt.Errorf("peer closed")
		}
		b = b[n:]
	}
	return nil
}

// sock listens (server: accepts one connection) or connects, as the C peer does.
func sock(kind, where string, server bool) (int, error) {
	var sa syscall.Sockaddr
	domain := syscall.AF_UNIX
	if kind == "uds" {
		sa = &syscall.SockaddrUnix{Name: where}
	} else {
		port, err := strconv.Atoi(where)
		if err != nil {
			return -1, err
		}
		domain, sa = syscall.AF_INET, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}
	}
	fd, err := syscall.Socket(domain, syscall.SOCK_STREAM, 0)
	if err != nil {
		return -1, err
	}
	if server {
		if kind == "uds" {
			_ = os.Remove(where)
		} else {
			_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
		}
		if err := syscall.Bind(fd, sa); err != nil {
			return -1, err
		}
		if err := syscall.Listen(fd, 1); err != nil {
			return -1, err
		}
		fmt.Println("READY")
		if fd, _, err = syscall.Accept(fd); err != nil {
			return -1, err
		}
	} else if err := syscall.Connect(fd, sa); err != nil {
		return -1, err
	}
	if kind != "uds" {
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	}
	return fd, nil
}
