package trans

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hmc-go/hmc/status"
)

// RedisConfig is how an engine logs in to a Redis metadata server (Mooncake's
// MC_REDIS_USERNAME, MC_REDIS_PASSWORD and MC_REDIS_DB_INDEX, which the C and Python faces read).
type RedisConfig struct {
	Username, Password string
	DB                 int // 0..255
}

// redisMeta is a Redis server as metadata (Mooncake's redis:// plugin): keys set, read and
// deleted with SET, GET and DEL.
type redisMeta struct {
	c   *redis.Client
	url string
}

// quiet drops go-redis's own log lines (it prints dial failures to stderr): failures reach the
// caller as errors.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

var quietOnce sync.Once

func openRedis(url string, rc RedisConfig, timeout time.Duration) (*redisMeta, error) {
	quietOnce.Do(func() { redis.SetLogger(quiet{}) })
	addr := strings.TrimSuffix(strings.TrimPrefix(url, "redis://"), "/")
	if _, err := redis.ParseURL("redis://" + addr); err != nil || addr == "" || strings.ContainsAny(addr, "/?@") {
		return nil, fmt.Errorf("redis metadata server %q (want redis://host:port): %w", url, status.ErrInvalidConfig)
	}
	if rc.DB < 0 || rc.DB > 255 {
		return nil, fmt.Errorf("redis database %d (want 0..255): %w", rc.DB, status.ErrInvalidConfig)
	}
	c := redis.NewClient(&redis.Options{Addr: addr, Username: rc.Username, Password: rc.Password,
		DB: rc.DB, DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, MaxRetries: 1, DisableIdentity: true})
	return &redisMeta{c: c, url: url}, nil
}

func (r *redisMeta) wrap(op, key string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, redis.Nil):
		return fmt.Errorf("redis %s: no key %q: %w", r.url, key, status.ErrNotFound)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("redis %s: %s %q: %w: %w", r.url, op, key, status.ErrTimeout, err)
	}
	return fmt.Errorf("redis %s: %s %q: %w: %w", r.url, op, key, status.ErrFailed, err)
}

func (r *redisMeta) Get(ctx context.Context, key string) ([]byte, error) {
	v, err := r.c.Get(ctx, key).Bytes()
	return v, r.wrap("GET", key, err)
}

func (r *redisMeta) Put(ctx context.Context, key string, value []byte) error {
	return r.wrap("SET", key, r.c.Set(ctx, key, value, 0).Err())
}

func (r *redisMeta) Delete(ctx context.Context, key string) error {
	n, err := r.c.Del(ctx, key).Result()
	if err == nil && n == 0 {
		err = redis.Nil
	}
	return r.wrap("DEL", key, err)
}

func (r *redisMeta) Close() { _ = r.c.Close() }
