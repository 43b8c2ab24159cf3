// Package auth authenticates the links between HMC processes: the data transports' connections
// (tcp lanes, shm links, the UCX bootstrap) and the control plane's, as coord/store and the
// fabric's request sockets do theirs. It is off by default and one option away: a shared secret
// (Config.Secret) both ends prove at connect, and optional mutual TLS (Config.TLS) for links that
// leave the host.
//
// Every authenticated link opens with the initiator's 64-byte preamble, before the protocol's
// own first byte, so a target learns what the initiator offers before it reads anything else,
// and both ends refuse a mismatch with a reply that names it (docs/wire/auth.md):
//
//	initiator → target  "HMCAUTH1" version flags reserved[22] nonce_i[32]
//	target → initiator  "HMCAUTH1" version flags status reserved[21] nonce_t[32]
//	[TLS 1.3 handshake, initiator as client, certificates verified both ways]
//	initiator → target  HMAC-SHA256(secret, "hmc-auth <proto> initiator" | nonce_t | nonce_i)
//	target → initiator  status, HMAC-SHA256(secret, "hmc-auth <proto> target" | nonce_i | nonce_t)
//
// A target that does not authenticate answers a preamble with a refusal (Refuse), and an
// initiator that does not authenticate recognises a target's refusal where it expected the
// protocol's answer (Refusal): either way the error wraps status.ErrPermission and says which
// side lacks what, instead of a hang or a bare "connection closed". The secret keeps strangers
// out; only TLS also protects the bytes from whoever is on the path.
package auth
