// Package peercred admits or refuses the process at the other end of a Unix socket by the
// credentials the kernel recorded for it (SO_PEERCRED), before anything is sent to it or read
// from it. Abstract Unix sockets have no file permissions, so without this check any local
// user could connect to a listening HMC process; a path socket is checked the same way.
package peercred
