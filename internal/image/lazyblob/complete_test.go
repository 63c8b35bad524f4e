package lazyblob

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestBlobCompletesInBackground: after a reader fetched one chunk, the
// others are fetched in the background until the blob is whole; without
// the option nothing more is fetched.
func TestBlobCompletesInBackground(t *testing.T) {
	data := testenv.RandBytes(31, 6*testChunk)
	st, idx := storeBlob(t, data, testChunk)
	for _, complete := range []bool{false, true} {
		b, stats, _ := openBlob(t, t.TempDir(), idx, st, 10*time.Second)
		b.complete = complete
		if _, err := readBlob(context.Background(), b, 2*testChunk, 10); err != nil {
			t.Fatal(err)
		}
		if !complete {
			time.Sleep(3 * completeIdle)
			if s := stats.snapshot(); s.ChunksFetched != 1 {
				t.Errorf("without background completion: %d chunks fetched, want the 1 read", s.ChunksFetched)
			}
			continue
		}
		testenv.Eventually(t, 10*time.Second, "every chunk to be fetched in the background", func() bool {
			return stats.snapshot().ChunksFetched == int64(len(idx.Chunks))
		})
		if !b.cache.complete() {
			t.Error("the blob is not complete after the background fetched every chunk")
		}
	}
}

// firstThenStall reads its first range from the store and stalls every
// later one until its context ends, counting them.
type firstThenStall struct {
	Source
	n     atomic.Int32
	calls chan struct{}
}

func (f *firstThenStall) ReadRange(ctx context.Context, digest string, off, n int64) (io.ReadCloser, error) {
	if f.n.Add(1) == 1 {
		return f.Source.ReadRange(ctx, digest, off, n)
	}
	f.calls <- struct{}{}
	<-ctx.Done() // bounded: the fetch's deadline, or the blob's close, ends ctx
	return nil, ctx.Err()
}

// TestBlobCloseStopsCompletion: closing a blob whose completer waits on a
// stalled store returns at once (not after the fetch deadline) and
// leaves no goroutine.
func TestBlobCloseStopsCompletion(t *testing.T) {
	goroutines := testenv.Goroutines()
	data := testenv.RandBytes(32, 4*testChunk)
	st, idx := storeBlob(t, data, testChunk)
	src := &firstThenStall{Source: st, calls: make(chan struct{}, 8)}
	cache, err := openCache(t.TempDir(), idx)
	if err != nil {
		t.Fatal(err)
	}
	b := newBlob(idx, src, cache, &counters{}, slogDiscard(), time.Minute)
	b.complete = true
	if _, err := readBlob(context.Background(), b, 0, 10); err != nil {
		t.Fatal(err)
	}
	testenv.Recv(t, src.calls, 10*time.Second, "the completer's fetch to reach the store")
	start := time.Now()
	if err := b.close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("closing took %v with the completer waiting on a fetch of a 1 min deadline", d)
	}
	testenv.GoroutinesSettle(t, goroutines)
}
