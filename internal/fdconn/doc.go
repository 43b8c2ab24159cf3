// Package fdconn is a net.Conn over a socket that the runtime's netpoller does not watch: the
// goroutine that reads or writes it blocks its own thread in the socket's read(2) or write(2),
// as a C program's blocking call does, and the kernel wakes that thread directly. That block
// lasts a slice (1 ms, SO_RCVTIMEO/SO_SNDTIMEO); past it the call waits in poll(2) on the
// socket and an eventfd, through which deadlines, contexts and Close reach it at once.
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
// A deadline or a context's end is seen by a call in its first slice at the slice's end (a
// call whose deadline is nearer waits in poll(2) from the start; a background reader that
// another goroutine interrupts turns direct reads off); Close shuts the socket down, which
// ends a call in read(2) or write(2) at once.
//
// Calls of one direction are serialised by that direction's lock, the only one a call takes:
// Close takes both to wait for the calls in progress before it closes the descriptor. A Write
// (or WriteContext, which also sets the context) writes all its bytes before the next begins,
// so a writer that puts each message in one call needs no lock of its own.
package fdconn
