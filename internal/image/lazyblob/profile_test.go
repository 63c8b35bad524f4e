package lazyblob

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/testenv"
)

// profiles collects what OnProfile is handed.
type profiles struct {
	mu  sync.Mutex
	got [][]int
}

func (p *profiles) on(_ string, order []int) {
	p.mu.Lock()
	p.got = append(p.got, order)
	p.mu.Unlock()
}

func (p *profiles) last() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.got) == 0 {
		return nil
	}
	return p.got[len(p.got)-1]
}

// TestProfile: a blob's profile is the chunks in the order readers first
// asked for them (a chunk asked for again, and the completer's and a
// prefetch's asks, do not count); it is handed over once readers pause,
// and again at close with what came after.
func TestProfile(t *testing.T) {
	data := testenv.RandBytes(41, 8*testChunk)
	st, idx := storeBlob(t, data, testChunk)
	b, _, _ := openBlob(t, t.TempDir(), idx, st, 10*time.Second)
	var p profiles
	b.onProfile = p.on
	ctx := context.Background()
	for _, c := range []int64{5, 2, 5, 7} {
		if _, err := readBlob(ctx, b, c*testChunk, 10); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.get(ctx, 1, true); err != nil { // the completer's kind of ask
		t.Fatal(err)
	}
	if got := b.profile(); !slices.Equal(got, []int{5, 2, 7}) {
		t.Fatalf("profile %v, want [5 2 7]", got)
	}
	testenv.Eventually(t, 3*profileQuiet, "the profile to be handed over once reads pause", func() bool {
		return slices.Equal(p.last(), []int{5, 2, 7})
	})
	if _, err := readBlob(ctx, b, 0, 10); err != nil {
		t.Fatal(err)
	}
	if err := b.close(); err != nil {
		t.Fatal(err)
	}
	if got := p.last(); !slices.Equal(got, []int{5, 2, 7, 0}) {
		t.Errorf("at close the profile handed over is %v, want [5 2 7 0]", got)
	}
}

// TestPrefetch: a prefetch fetches the chunks it is given before any
// reader asks, skipping cached ones and bad indexes; readers then find
// them cached.
func TestPrefetch(t *testing.T) {
	data := testenv.RandBytes(43, 8*testChunk)
	st, idx := storeBlob(t, data, testChunk)
	src := countReads(st)
	b, stats, _ := openBlob(t, t.TempDir(), idx, src, 10*time.Second)
	ctx := context.Background()
	if _, err := readBlob(ctx, b, 3*testChunk, 10); err != nil {
		t.Fatal(err)
	}
	b.prefetch([]int{6, 3, 1, -1, 99, 4})
	testenv.Eventually(t, 10*time.Second, "the prefetch to fetch chunks 6, 1 and 4", func() bool {
		return stats.snapshot().ChunksFetched == 4
	})
	if _, n := src.reads(); n != 4 {
		t.Errorf("%d reads from the source, want 4 (chunk 3 once, then 6, 1, 4)", n)
	}
	for _, c := range []int64{6, 1, 4} {
		got, err := readBlob(ctx, b, c*testChunk, testChunk)
		if err != nil || !bytes.Equal(got, data[c*testChunk:(c+1)*testChunk]) {
			t.Fatalf("chunk %d after its prefetch: %v", c, err)
		}
	}
	if s := stats.snapshot(); s.ChunksFetched != 4 || s.CacheHits < 3 {
		t.Errorf("after reading the prefetched chunks: %+v", s)
	}
	if got := b.profile(); !slices.Equal(got, []int{3, 6, 1, 4}) {
		t.Errorf("profile %v: a prefetch's asks must not count", got)
	}
}
