// Package fdconn is a net.Conn over a socket that the runtime's netpoller does not watch: the
// goroutine that reads or writes it blocks its own thread in poll(2) until the socket is ready,
// as a C program's blocking call does, and the kernel wakes that thread directly.
//
// Why: a read parked on the netpoller is woken by the netpoller's thread, which hands the
// goroutine to a thread that runs it, two wake-ups where a blocking read has one; and a
// socket the netpoller watches wakes its epoll_wait for every message that arrives, even
// while a thread already waits on it in poll(2). For a request and answer between two
// processes on one host (the control plane's round trip) that is the difference between ~9 µs
// and ~15-30 µs on a two-core machine.
//
// The price: each read or write in progress holds an OS thread (without a P once the runtime
// takes it back), and a connection's background reader holds one for as long as it waits.
// Deadlines, Close and a second goroutine's interruption reach a blocked call through an
// eventfd in the same poll(2).
package fdconn
