// Package httpmeta is Mooncake's HTTP metadata protocol: a key/value service over plain HTTP at
// one path (Mooncake's default is /metadata), a key in the query string.
//
//	GET    /metadata?key=K   200 and the value, 404 when absent
//	PUT    /metadata?key=K   200; the body is the value (a key containing "rpc_meta" that exists
//	                         with another value is refused with 400, as Mooncake's servers do)
//	DELETE /metadata?key=K   200, 404 when absent
//
// A request without a key gets 400, another method 405. [Server] serves it (`hmc store serve
// --http ADDR`) and [Client] is its client; both also work with Mooncake's own
// http_metadata_server. Transfer engines given an http:// metadata URL publish themselves
// through it (docs/wire/metadata.md).
package httpmeta
