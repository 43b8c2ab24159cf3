package hmc_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/hmc-go/hmc"
)

// Two Sessions in one process, as two processes would use them: the server serves its buffer,
// the client puts bytes into it and then tells it so with a control message. (README.md shows
// this example; TestReadmeSnippetsCompile keeps the two the same.)
func Example() {
	// README: session
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "hmc-example") // for the Unix control socket
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	srv, err := hmc.NewSession(0, 64<<20, hmc.CPU, 1, "127.0.0.1")
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	// data and control on free ports (0: pick one), control also on dir/hmc_ctrl_rank_0.sock
	if err := srv.InitServer("127.0.0.1", 0, 0, 0, dir, hmc.AUTO); err != nil {
		log.Fatal(err)
	}
	dataPort, ctrlPort := srv.DataPort(), srv.CtrlPort()

	cli, err := hmc.NewSession(0, 64<<20, hmc.CPU, 2, "127.0.0.1")
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	peer, err := cli.Connect(ctx, 0, 1, "127.0.0.1", dataPort, ctrlPort, dir, hmc.AUTO)
	if err != nil {
		log.Fatal(err)
	}
	msg := []byte("hello hmc")
	// straight from msg's memory into the server's buffer at offset 0; visible on return
	if err := peer.PutFrom(ctx, msg, 0); err != nil {
		log.Fatal(err)
	}
	if err := peer.CtrlSend(ctx, 1); err != nil { // safe: the bytes are already there
		log.Fatal(err)
	}

	tag, err := srv.CtrlRecv(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	got := make([]byte, len(msg))
	if err := srv.GetInto(got, 0); err != nil {
		log.Fatal(err)
	}
	fmt.Println(tag, string(got))
	// README: end

	// Output: 1 hello hmc
}
