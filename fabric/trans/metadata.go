package trans

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/hmc-go/hmc/coord/httpmeta"
	"github.com/hmc-go/hmc/coord/store"
	"github.com/hmc-go/hmc/status"
	"github.com/hmc-go/hmc/transport"
)

// NormalizeMetadata maps a metadata server as Mooncake takes it onto the URL Create opens:
// "" and P2PHANDSHAKE are P2P; "host:port" (no scheme, Mooncake's etcd form, several
// comma-separated) is etcd://host:port; tcp://, etcd://, http://, https:// and redis:// stay as
// they are. Other schemes are refused with the ones that work.
func NormalizeMetadata(url string) (string, error) {
	url = strings.TrimSpace(url)
	if url == "" || url == P2P {
		return P2P, nil
	}
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok {
		return "etcd://" + url, nil
	}
	switch scheme {
	case "tcp", "tcp6", "etcd", "http", "https", "redis":
		if rest == "" {
			return "", fmt.Errorf("trans: metadata server %q has no address: %w", url, status.ErrInvalidConfig)
		}
		return url, nil
	}
	return "", fmt.Errorf("trans: metadata server %q: scheme %q is not served here (P2PHANDSHAKE, host:port or etcd:// for etcd, "+
		"tcp:// for the embedded store, http:// for Mooncake's HTTP metadata server, redis://): %w", url, scheme, status.ErrUnsupported)
}

// engineKey is where an engine is published: in a store (tcp://, etcd://) and on an HTTP
// metadata server alike (docs/wire/metadata.md).
func engineKey(uid string) string { return "trans/engine/" + uid }

// kvPrefix is put before engineKey on an HTTP or Redis metadata server, which Mooncake's
// engines share under mooncake/.
const kvPrefix = "hmc/"

// kvMeta is a plain key/value metadata server: Mooncake's HTTP metadata server or Redis. Get
// and Delete of an absent key return an error matching status.ErrNotFound.
type kvMeta interface {
	Get(ctx context.Context, key string) ([]byte, error)
	Put(ctx context.Context, key string, value []byte) error
	Delete(ctx context.Context, key string) error
	Close()
}

// openKV publishes this engine on an HTTP (http://, https://) or Redis (redis://) metadata
// server.
func (e *Engine) openKV(ctx context.Context, url string) error {
	if strings.HasPrefix(url, "redis://") {
		r, err := openRedis(url, e.cfg.Redis, e.cfg.Timeout)
		if err != nil {
			return fmt.Errorf("trans: %w", err)
		}
		e.web = r
	} else {
		c, err := httpmeta.NewClient(url, e.cfg.Timeout)
		if err != nil {
			return fmt.Errorf("trans: %w", err)
		}
		e.web = c
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	h, _ := json.Marshal(e.hello()) // a hello always marshals
	if err := e.web.Put(ctx, kvPrefix+engineKey(e.id), h); err != nil {
		return fmt.Errorf("trans: publishing this engine on the metadata server %s: %w", url, err)
	}
	return nil
}

// published checks that uid is published in this engine's metadata (a store or an HTTP
// server): a peer the metadata says nothing of fails at once with ErrNotFound, as in Mooncake.
// A metadata server that cannot be asked does not stop the data plane: the peer is then asked
// directly. In P2P mode every well-formed id passes.
func (e *Engine) published(ctx context.Context, uid string) error {
	var err error
	switch {
	case e.kv != nil:
		if _, err = e.kv.Get(ctx, engineKey(uid), 0); errors.Is(err, store.ErrNotExist) {
			return fmt.Errorf("trans: peer %s is not published in the metadata store: %w: %w", uid, status.ErrNotFound, err)
		}
	case e.web != nil:
		if _, err = e.web.Get(ctx, kvPrefix+engineKey(uid)); errors.Is(err, status.ErrNotFound) {
			return fmt.Errorf("trans: peer %s is not published on the metadata server: %w", uid, err)
		}
	}
	if err != nil {
		e.log.Debug("trans: metadata unreachable; asking the peer directly", "peer", uid, "err", err)
	}
	return nil
}

// Probe checks that peer is published (with metadata) and answers now, asking it afresh (not
// a cached answer): Mooncake's send_probe.
func (e *Engine) Probe(ctx context.Context, uid string) error {
	ctx, cancel := e.bound(ctx)
	defer cancel()
	if _, _, err := ParseUniqueID(uid); err != nil {
		return err
	}
	if err := e.published(ctx, uid); err != nil {
		return err
	}
	var h hello
	return e.call(ctx, uid, "hello", nil, &h)
}

// bound gives ctx the engine's timeout when it has no deadline.
func (e *Engine) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, e.cfg.Timeout)
}

// Protocol turns a Mooncake protocol name into the transports an engine uses: "tcp" is TCP;
// "rdma" is UCX's RDMA transports (a -tags ucx build on a host with an RDMA device), or TCP
// with forceTCP (Mooncake's MC_FORCE_TCP=1, which the C and Python faces read); "ucx" is UCX
// over any device; "shm" is shared memory. Peers on this host use shared memory whatever the
// protocol. Names of Mooncake transports that have no counterpart here ("efa", "nvlink",
// "ascend", "cxl", ...) are refused with the reason.
func Protocol(name string, forceTCP bool) ([]transport.ConnType, error) {
	p := strings.ToLower(strings.TrimSpace(name))
	if p == "rdma" && forceTCP {
		p = "tcp"
	}
	switch p {
	case "", "tcp":
		return []transport.ConnType{transport.SHM, transport.TCP}, nil
	case "rdma":
		return []transport.ConnType{transport.SHM, transport.RDMA}, nil
	case "ucx":
		return []transport.ConnType{transport.SHM, transport.UCX}, nil
	case "shm":
		return []transport.ConnType{transport.SHM, transport.TCP}, nil
	}
	return nil, fmt.Errorf("trans: protocol %q is not served here (tcp, rdma, ucx or shm; peers on one host use shared memory "+
		"whatever the protocol): %w", name, status.ErrUnsupported)
}
