// Package spinread reads a socket by busy-polling it (non-blocking read(2) in a loop, yielding
// the P between tries) for a while before letting the runtime park the goroutine until the
// socket is readable. A parked read that the peer's answer wakes costs a netpoll wake-up and a
// goroutine switch (microseconds); a spinning one sees the answer as it lands, but holds its
// core meanwhile, which the peer may need when processes outnumber cores. For request and answer
// loops between processes that have a core each, opt-in: the TCP transport's lanes
// (tcp.Config.BusyPoll) and the control plane's connections (ctrl.Config.ReadSpin).
package spinread
