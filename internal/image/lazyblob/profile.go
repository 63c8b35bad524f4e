package lazyblob

import (
	"slices"
	"sync"
	"time"
)

// Access profiles: the chunks of a blob in the order its readers first
// asked for them (the completer's and a prefetch's asks do not count).
// Once readers have asked for no new chunk for profileQuiet, and when the
// blob closes, the profile so far is handed to Options.OnProfile, which
// keeps it with the layer (merged across runs and nodes); a node that
// serves the blob later fetches those chunks ahead of its readers
// (Server.Prefetch), prefetchParallel at a time, so that a sandbox's
// first reads find them local instead of fetching one chunk at a time.
const (
	maxProfile       = 4096 // chunks recorded per blob: 4 GiB of 1 MiB chunks
	profileQuiet     = 2 * time.Second
	prefetchParallel = 4
)

// touchLocked records that a reader asked for chunk i, and starts the
// profile's reporter if it has news and none runs.
//
// Preconditions: b.mu must be held.
func (b *blob) touchLocked(i int) {
	if b.seen == nil {
		b.seen = make([]bool, len(b.idx.Chunks))
	}
	if b.seen[i] || len(b.touched) >= maxProfile {
		return
	}
	b.seen[i] = true
	b.touched = append(b.touched, i)
	b.lastTouch = time.Now()
	if b.onProfile != nil && !b.reporting && !b.closed {
		b.reporting = true
		b.fills.Add(1)
		go b.reportProfile()
	}
}

// reportProfile hands the profile to onProfile once readers have asked
// for no new chunk for profileQuiet, or the blob closes, and stops once
// all of it was handed over.
func (b *blob) reportProfile() {
	defer b.fills.Done()
	for {
		b.mu.Lock()
		quiet := time.Since(b.lastTouch)
		b.mu.Unlock()
		closing := quiet < profileQuiet && !b.sleep(b.life, profileQuiet-quiet)
		if !closing && quiet < profileQuiet {
			continue // slept: look again
		}
		b.mu.Lock()
		order, n := slices.Clone(b.touched), len(b.touched)
		news := n > b.reported
		b.reported = n
		b.mu.Unlock()
		if news {
			b.onProfile(b.idx.Digest, order)
		}
		b.mu.Lock()
		done := len(b.touched) == b.reported || closing
		if done {
			b.reporting = false
		}
		b.mu.Unlock()
		if done {
			return
		}
	}
}

// profile returns the chunks readers have asked for, in order.
func (b *blob) profile() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.touched)
}

// prefetch fetches the chunks of order not cached yet, in the
// background, prefetchParallel at a time, through the same flights as
// readers (a reader that asks for one being fetched waits for that
// fetch). It stops when the blob closes.
func (b *blob) prefetch(order []int) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.fills.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.fills.Done()
		ctx := b.life
		next := make(chan int)
		var wg sync.WaitGroup
		for range prefetchParallel {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					if _, err := b.get(ctx, i, true); err != nil && ctx.Err() == nil {
						b.log.Debug("prefetching a chunk", "chunk", i, "err", err)
					}
				}
			}()
		}
		defer wg.Wait()
		defer close(next)
		for _, i := range order {
			if i < 0 || i >= len(b.idx.Chunks) || b.cache.chunk(i) == chunkVerified {
				continue
			}
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
}
