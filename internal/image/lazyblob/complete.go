package lazyblob

import (
	"context"
	"time"
)

// Background completion: once a reader has fetched a chunk of a blob
// (Options.Complete), the blob's other chunks are fetched too, one at a
// time in order, while no reader has waited for a fetch in the last
// completeIdle. Later reads then find them local, and a blob fetched
// whole can be mounted over its cache file (Server.CompleteFile). The
// completer yields to readers and never races them for a chunk: both go
// through the same flight.
const (
	completeIdle  = 200 * time.Millisecond
	completePause = time.Second // after a failed fetch
)

// startCompleterLocked starts the completer if the blob completes in the
// background and it has not been started.
//
// Preconditions: b.mu must be held.
func (b *blob) startCompleterLocked() {
	if !b.complete || b.completing || b.closed {
		return
	}
	b.completing = true
	b.fills.Add(1)
	go b.completeAll()
}

// completeAll fetches every chunk not cached yet, pausing while readers
// fetch, until the blob is whole or closed.
func (b *blob) completeAll() {
	defer b.fills.Done()
	ctx := b.life
	for i := range b.idx.Chunks {
		if b.cache.chunk(i) == chunkVerified {
			continue
		}
		if !b.waitIdle(ctx) {
			return
		}
		if _, err := b.get(ctx, i, true); err != nil {
			if ctx.Err() != nil {
				return
			}
			b.log.Warn("completing a blob in the background: a chunk failed; going on", "chunk", i, "err", err)
			if !b.sleep(ctx, completePause) {
				return
			}
		}
	}
	b.log.Debug("blob complete")
}

// waitIdle waits until no reader has waited for a fetch for
// completeIdle; false if ctx ended first.
func (b *blob) waitIdle(ctx context.Context) bool {
	for {
		b.mu.Lock()
		quiet := time.Since(b.lastMiss)
		b.mu.Unlock()
		if quiet >= completeIdle {
			return true
		}
		if !b.sleep(ctx, completeIdle-quiet) {
			return false
		}
	}
}

func (b *blob) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
