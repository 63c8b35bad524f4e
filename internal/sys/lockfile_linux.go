package sys

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"
)

// LockFile takes an exclusive flock on path (created if missing),
// waiting for it until ctx ends, and returns the function that releases
// it. The lock is per open file, so it also excludes other goroutines of
// this process. Caches that several processes fill (built-in layers, the
// VM kernel) serialise their builders with it.
func LockFile(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := TryLock(f)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, ErrLocked) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
