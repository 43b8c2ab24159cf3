// Package hmc is the HMC-Go facade: the Session (one registered buffer plus a Communicator,
// the Go form of the Python SDK's Session), which hands out a Peer handle per connected process
// carrying the operations, and aliases of the types and errors that live in lower packages, as
// os.ErrNotExist is fs.ErrNotExist. (The seeds' per-call (ip, port, conn) addressing lives in
// the C and Python SDK layers, which look the Peer up.)
//
// A minimal exchange between two processes:
//
//	srv, _ := hmc.NewSession(0, 64<<20, hmc.CPU, 1, "127.0.0.1")
//	_ = srv.InitServer("127.0.0.1", 2025, 5001, 0, "/tmp", hmc.TCP)
//	tag, _ := srv.CtrlRecv(ctx, 1) // after the client's put
//
//	cli, _ := hmc.NewSession(0, 64<<20, hmc.CPU, 1, "127.0.0.1")
//	peer, _ := cli.Connect(ctx, 0, 1, "127.0.0.1", 2025, 5001, "/tmp", hmc.TCP)
//	n, _ := cli.Put([]byte("hello hmc"), 0)
//	_ = peer.Put(ctx, 0, 0, n) // local offset 0 to the peer's offset 0
//	_ = peer.CtrlSend(ctx, 1)
package hmc
