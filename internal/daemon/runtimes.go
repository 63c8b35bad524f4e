package daemon

import (
	"context"
	"path/filepath"
	"time"

	"github.com/dsec-dev/dsec/internal/function"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// runtimes builds the tier runtimes this node offers.
func (d *daemon) runtimes(ctx context.Context) (*sandbox.Registry, func(), error) {
	reg := sandbox.NewRegistry()
	fn, err := function.New(ctx, function.Options{
		StateDir: filepath.Join(d.cfg.DataDir, "node", "function"),
		CacheDir: filepath.Join(d.cfg.DataDir, "cache", "wasm"),
		Logger:   d.log.With("tier", "function"),
		PoolSize: d.cfg.Node.FunctionPoolSize,
	})
	if err != nil {
		return nil, nil, err
	}
	if err := reg.Register(fn); err != nil {
		return nil, nil, err
	}
	closeAll := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, rt := range reg.All() {
			if err := rt.Close(ctx); err != nil {
				d.log.Warn("closing runtime", "tier", rt.Tier(), "err", err)
			}
		}
	}
	return reg, closeAll, nil
}
