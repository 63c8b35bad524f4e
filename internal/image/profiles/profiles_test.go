package profiles

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testenv"
)

const digest = "sha256:" + "ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12"

// TestMerge: profiles merge in first-seen order across writers (two
// Stores on one server, as two nodes), and stay what they were when
// nothing new comes.
func TestMerge(t *testing.T) {
	nc, _ := testenv.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := Open(ctx, nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(ctx, nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := a.Profile(ctx, digest); err != nil || got != nil {
		t.Fatalf("a profile never written: %v, %v", got, err)
	}
	if err := a.Merge(ctx, digest, []int{5, 2, 7}); err != nil {
		t.Fatal(err)
	}
	if err := b.Merge(ctx, digest, []int{2, 9, -1, 5, 1}); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Profile(ctx, digest); err != nil || !slices.Equal(got, []int{5, 2, 7, 9, 1}) {
		t.Fatalf("merged profile %v, %v; want [5 2 7 9 1]", got, err)
	}
	// Concurrent writers lose nothing.
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := []*Store{a, b}[w%2]
			if err := s.Merge(ctx, digest, []int{100 + w}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait() // bounded: each Merge is a few requests within ctx
	got, _ := a.Profile(ctx, digest)
	for w := range 4 {
		if !slices.Contains(got, 100+w) {
			t.Errorf("writer %d's chunk is missing from %v", w, got)
		}
	}
	if _, err := a.Profile(ctx, "sha256:nothex"); errdefs.CodeOf(err) != api.CodeInvalidDigest {
		t.Errorf("a bad digest: %v", err)
	}
}

func TestUnion(t *testing.T) {
	long := make([]int, MaxChunks+10)
	for i := range long {
		long[i] = i
	}
	if got := Union(nil, long); len(got) != MaxChunks {
		t.Errorf("a union past the cap holds %d", len(got))
	}
	if got := Union([]int{3, 1}, []int{1, 2, 3, 4}); !slices.Equal(got, []int{3, 1, 2, 4}) {
		t.Errorf("Union = %v", got)
	}
}
