package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestMemStoreMatchesStore runs one sequence of record operations against
// the JetStream store and against memStore, and requires the same
// outcomes: what the control plane's tests learn from the fake holds for
// the store it stands in for.
func TestMemStoreMatchesStore(t *testing.T) {
	nc, _ := testenv.NATS(t)
	var real [2]*store.Store
	for i := range real {
		s, err := store.Open(context.Background(), nc, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		real[i] = s
	}
	mem := newMemStore()
	want := recordContract(t, real[0], real[1])
	got := recordContract(t, mem, mem.peer())
	if !slices.Equal(got, want) {
		t.Errorf("memStore:\n\t%v\nstore.Store:\n\t%v", got, want)
	}
}

// recordContract writes through a (the watcher, applying its own writes
// as the manager does) and b (another writer), and returns what each
// call answered and what a's watch delivered, with revisions shown
// relative to each other.
func recordContract(t *testing.T, a, b sandboxRecords) []string {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out []string
	rec := func(id string, s api.State) store.SandboxRecord {
		return store.SandboxRecord{Sandbox: api.Sandbox{ID: id, Tier: api.TierFunction, State: s}, Owner: "o"}
	}
	outcome := func(what string, err error) {
		out = append(out, fmt.Sprintf("%s: %s %s", what, errdefs.ClassOf(err), errdefs.CodeOf(err)))
	}

	r1, err := a.CreateSandbox(ctx, rec("sb-1", api.StatePending))
	outcome("create", err)
	_, err = b.CreateSandbox(ctx, rec("sb-1", api.StatePending))
	outcome("create again", err)
	_, _, err = a.GetSandbox(ctx, "sb-none")
	outcome("get missing", err)
	outcome("purge missing", a.PurgeSandbox(ctx, "sb-none"))

	var mu sync.Mutex
	var seen []string
	own := map[string]uint64{} // the revisions a applied itself
	known := func(id string, rev uint64) bool {
		mu.Lock()
		defer mu.Unlock()
		return own[id] >= rev
	}
	err = a.WatchSandboxes(ctx, slog.New(slog.DiscardHandler), known, func(c *store.SandboxChange) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case c == nil:
			seen = append(seen, "loaded")
		case c.Deleted:
			seen = append(seen, "purged "+c.Record.ID)
		default:
			seen = append(seen, string(c.Record.State)+" "+c.Record.ID)
		}
	})
	outcome("watch", err)
	// As Start does, wait for the initial values: they are read after
	// WatchSandboxes returns, and would show later writes.
	waitSeen := func(done func(seen []string) bool) {
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			ok := done(seen)
			mu.Unlock()
			if ok || time.Now().After(deadline) {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitSeen(func(seen []string) bool { return slices.Contains(seen, "loaded") })
	applied := func(id string, rev uint64, err error) {
		if err == nil {
			mu.Lock()
			own[id] = rev
			mu.Unlock()
		}
	}

	r2, err := a.UpdateSandbox(ctx, rec("sb-1", api.StateRunning), r1)
	applied("sb-1", r2, err)
	outcome("update", err)
	out = append(out, fmt.Sprintf("revision grew: %v", r2 > r1))
	_, err = b.UpdateSandbox(ctx, rec("sb-1", api.StateFailed), r1)
	outcome("update at a stale revision", err)
	got, grev, err := b.GetSandbox(ctx, "sb-1")
	outcome("get", err)
	out = append(out, fmt.Sprintf("got %s at the update's revision: %v", got.State, grev == r2))
	r3, err := b.UpdateSandbox(ctx, rec("sb-1", api.StateStopping), r2)
	outcome("other's update", err)
	// The store's watch may skip a change replaced soon after (it is
	// level-triggered): let it deliver this one before the next.
	waitSeen(func(seen []string) bool { return slices.Contains(seen, "stopping sb-1") })
	r4, err := a.CreateSandbox(ctx, rec("sb-2", api.StatePending))
	applied("sb-2", r4, err)
	outcome("create 2", err)
	out = append(out, fmt.Sprintf("revisions across keys grew: %v", r4 > r3 && r3 > r2))
	outcome("other's purge", b.PurgeSandbox(ctx, "sb-1"))
	outcome("own purge", a.PurgeSandbox(ctx, "sb-2"))
	waitSeen(func(seen []string) bool {
		return slices.Contains(seen, "purged sb-1") && slices.Contains(seen, "purged sb-2")
	})
	_, _, err = a.GetSandbox(ctx, "sb-1")
	outcome("get purged", err)
	_, err = a.UpdateSandbox(ctx, rec("sb-1", api.StateRunning), r3)
	outcome("update purged", err)
	r5, err := b.CreateSandbox(ctx, rec("sb-1", api.StatePending))
	outcome("create purged", err)
	out = append(out, fmt.Sprintf("revision after purge grew: %v", r5 > r4))

	// The watch runs on its own goroutine in the store: wait for the
	// last change it must deliver.
	waitSeen(func(seen []string) bool { return len(seen) > 2 && seen[len(seen)-1] == "pending sb-1" })
	mu.Lock()
	out = append(out, seen...)
	mu.Unlock()
	return out
}
