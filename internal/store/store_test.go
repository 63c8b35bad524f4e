package store

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testenv"
)

func open(t *testing.T) *Store {
	t.Helper()
	s, _ := openPair(t)
	return s
}

// openPair opens two Stores on one server: a watcher's own writes are
// skipped by its watch, another's are not.
func openPair(t *testing.T) (*Store, *Store) {
	t.Helper()
	nc, _ := testenv.NATS(t)
	var out [2]*Store
	for i := range out {
		s, err := Open(context.Background(), nc, Options{})
		if err != nil {
			t.Fatal(err)
		}
		out[i] = s
	}
	return out[0], out[1]
}

func TestSandboxRecordCAS(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	rec := SandboxRecord{Sandbox: api.Sandbox{ID: "sb_1", Tier: "function", State: api.StatePending}, Owner: "o"}
	rev, err := s.CreateSandbox(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateSandbox(ctx, rec); !errors.Is(err, errdefs.Conflict) {
		t.Errorf("second create: err = %v, want Conflict", err)
	}
	rec.State = api.StateRunning
	rev2, err := s.UpdateSandbox(ctx, rec, rev)
	if err != nil {
		t.Fatal(err)
	}
	rec.State = api.StateStopping
	if _, err := s.UpdateSandbox(ctx, rec, rev); !errors.Is(err, errdefs.Conflict) {
		t.Errorf("stale update: err = %v, want Conflict", err)
	}
	got, gotRev, err := s.GetSandbox(ctx, "sb_1")
	if err != nil || got.State != api.StateRunning || gotRev != rev2 || got.Owner != "o" {
		t.Errorf("GetSandbox = %+v rev %d, %v", got, gotRev, err)
	}
	if _, _, err := s.GetSandbox(ctx, "nope"); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("missing: err = %v, want NotFound", err)
	}
	if _, _, err := s.GetSandbox(ctx, "bad key!"); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("invalid key: err = %v, want NotFound", err)
	}
}

func TestWatchSandboxes(t *testing.T) {
	s, other := openPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := s.CreateSandbox(ctx, SandboxRecord{Sandbox: api.Sandbox{ID: "before", State: api.StateRunning}}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	initialDone := make(chan struct{})
	err := s.WatchSandboxes(ctx, nil, nil, func(c *SandboxChange) {
		mu.Lock()
		defer mu.Unlock()
		if c == nil {
			close(initialDone)
			return
		}
		tag := c.Record.ID + ":" + string(c.Record.State)
		if c.Deleted {
			tag = c.Record.ID + ":deleted"
		}
		seen = append(seen, tag)
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Recv(t, initialDone, time.Minute, "the watch's initial values")
	rev, _ := other.CreateSandbox(ctx, SandboxRecord{Sandbox: api.Sandbox{ID: "after", State: api.StatePending}})
	other.UpdateSandbox(ctx, SandboxRecord{Sandbox: api.Sandbox{ID: "after", State: api.StateRunning}}, rev)
	other.PurgeSandbox(ctx, "before")
	// Changes come in revision order and end with each key's latest
	// state; a state replaced before the watcher read it may be skipped
	// (the watcher's consumer may restart from the last value per key).
	want := []string{"before:running", "after:pending", "after:running", "before:deleted"}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		got := append([]string(nil), seen...)
		mu.Unlock()
		coalesced := slices.DeleteFunc(slices.Clone(want), func(s string) bool { return s == "after:pending" })
		if slices.Equal(got, want) || slices.Equal(got, coalesced) {
			return
		}
		if len(got) >= len(want) || time.Now().After(deadline) {
			t.Fatalf("watch saw %q, want %q (or without after:pending)", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestImagesAndNodes(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	m := ImageManifest{Version: 1, Layers: []ImageLayer{{Role: "base", ID: "sha256:" + strings.Repeat("a", 64)}}}
	rec := ImageRecord{ID: m.ID(), Manifest: m, Created: time.Now()}
	if err := s.PutImage(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := s.PutImage(ctx, rec); err != nil {
		t.Errorf("putting the same image again: %v", err)
	}
	if err := s.SetImageName(ctx, "base/busybox:1.0", rec.ID); err != nil {
		t.Fatal(err)
	}
	n, err := s.GetImageName(ctx, "base/busybox:1.0")
	if err != nil || n.ID != rec.ID {
		t.Errorf("GetImageName = %+v, %v", n, err)
	}
	got, err := s.GetImage(ctx, n.ID)
	if err != nil || got.Manifest.Layers[0].Role != "base" {
		t.Errorf("GetImage = %+v, %v", got, err)
	}
	if _, err := s.GetImageName(ctx, "missing:1"); !errors.Is(err, errdefs.NotFound) || errdefs.CodeOf(err) != "image_not_found" {
		t.Errorf("missing image: err = %v", err)
	}
	recs, names, err := s.ListImages(ctx)
	if err != nil || len(recs) != 1 || len(names) != 1 {
		t.Errorf("ListImages = %d, %d, %v", len(recs), len(names), err)
	}
	if ImageManifest.ID(m) == (ImageManifest{Version: 1}).ID() {
		t.Error("different manifests have the same ID")
	}
	if err := s.PutNode(ctx, api.Node{ID: "n1", Ready: true}); err != nil {
		t.Fatal(err)
	}
	nodes, err := s.ListNodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].ID != "n1" {
		t.Errorf("ListNodes = %+v, %v", nodes, err)
	}
}

func TestEventsAreStored(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	for _, st := range []api.State{api.StatePending, api.StateRunning} {
		if err := s.PublishEvent(ctx, Event{Sandbox: "sb_9", State: st, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.FlushEvents(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := s.js.Stream(ctx, StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	si, err := info.Info(ctx)
	if err != nil || si.State.Msgs != 2 {
		t.Errorf("stream holds %d messages, want 2 (%v)", si.State.Msgs, err)
	}
}

// TestWatchSandboxesSkipsKnown: a change the watcher's Store wrote, or
// that the consumer says it holds, is not delivered; another writer's
// are.
func TestWatchSandboxesSkipsKnown(t *testing.T) {
	s, other := openPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var seen []string
	known := func(id string, _ uint64) bool { return id == "mine" }
	err := s.WatchSandboxes(ctx, nil, known, func(c *SandboxChange) {
		mu.Lock()
		defer mu.Unlock()
		if c != nil {
			seen = append(seen, c.Record.ID)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateSandbox(ctx, SandboxRecord{Sandbox: api.Sandbox{ID: "mine", State: api.StateRunning}}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.CreateSandbox(ctx, SandboxRecord{Sandbox: api.Sandbox{ID: "theirs", State: api.StateRunning}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		got := slices.Clone(seen)
		mu.Unlock()
		if slices.Equal(got, []string{"theirs"}) {
			return
		}
		if len(got) > 1 || slices.Contains(got, "mine") || time.Now().After(deadline) {
			t.Fatalf("watch saw %q, want only [theirs]", got)
		}
	}
}
