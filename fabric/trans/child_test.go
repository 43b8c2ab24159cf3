package trans

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hmc-go/hmc/memory"
)

// childSize is the target's managed buffer.
const childSize = 8 << 20

// iterByte is the byte at offset j of iteration i's write.
func iterByte(i, j int) byte { return byte(i*7 + j*13 + j>>9) }

// child is a target engine in its own process: HMC_TRANS_CHILD=target, HMC_TRANS_ID (its
// unique id), HMC_TRANS_META (metadata URL). It prints READY <id> <buffer address>, then
// checks each "check <i> <n> [<off>]" notification's n bytes (at offset off, 0 if absent)
// against iteration i's pattern and answers the sender with "ok <i>" or "bad <i> ...", and
// answers "zero <off> <n>" with "zero ok" or "zero bad" (are those bytes still all zero?).
func child() int {
	ctx := context.Background()
	cfg := DefaultConfig()
	if s := os.Getenv("HMC_TRANS_SECRET"); s != "" {
		cfg.Secret = []byte(s)
	}
	cfg.UniqueID = os.Getenv("HMC_TRANS_ID")
	e, err := Create(ctx, os.Getenv("HMC_TRANS_META"), cfg)
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	defer e.Close()
	addr, err := e.Malloc(childSize)
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	buf := memory.HostSlice(memory.Ptr(addr), childSize)
	fmt.Println("READY", e.UniqueID(), addr)
	for {
		for _, n := range e.Notifies() {
			var i, size int
			var from uint64
			if _, err := fmt.Sscanf(n.Msg, "pull %d %d", &from, &size); err == nil {
				// Read size bytes of the sender's memory at from into our buffer, and say
				// whether it worked (the sender measures registration-to-use).
				answer := "pulled ok"
				if err := e.Read(ctx, n.Name, addr, from, uint64(size)); err != nil {
					answer = "pulled " + err.Error()
				}
				if err := e.SendNotify(ctx, n.Name, Notify{Msg: answer}); err != nil {
					fmt.Println("FAIL answer:", err)
				}
				continue
			}
			var off int
			if _, err := fmt.Sscanf(n.Msg, "zero %d %d", &off, &size); err == nil {
				answer := "zero ok"
				if off < 0 || size < 0 || off+size > childSize || slices.ContainsFunc(buf[off:off+size], func(b byte) bool { return b != 0 }) {
					answer = "zero bad"
				}
				if err := e.SendNotify(ctx, n.Name, Notify{Msg: answer}); err != nil {
					fmt.Println("FAIL answer:", err)
				}
				continue
			}
			f := strings.Fields(n.Msg)
			if len(f) < 3 || f[0] != "check" {
				continue
			}
			i, _ = strconv.Atoi(f[1])
			size, _ = strconv.Atoi(f[2])
			if len(f) > 3 {
				off, _ = strconv.Atoi(f[3])
			}
			answer := "ok " + strconv.Itoa(i)
			if off < 0 || size < 0 || off+size > childSize {
				answer = fmt.Sprintf("bad %d range", i)
				size = 0
			}
			for j := range size {
				if buf[off+j] != iterByte(i, j) {
					answer = fmt.Sprintf("bad %d byte %d is %d, want %d", i, j, buf[off+j], iterByte(i, j))
					break
				}
			}
			if err := e.SendNotify(ctx, n.Name, Notify{Msg: answer}); err != nil {
				fmt.Println("FAIL answer:", err)
			}
		}
		time.Sleep(20 * time.Microsecond)
	}
}
