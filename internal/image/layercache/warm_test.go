package layercache

import (
	"context"
	"testing"
)

// TestWarm: a warmed stack is fetched and mounted, and a view of it
// afterwards fetches nothing; the warm holds no reference (GC clears all).
func TestWarm(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	layers := e.threeLayers()
	c := e.open(Options{})
	defer c.Close(ctx)
	if err := c.Warm(ctx, layers); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Fetches != 3 || st.Mounts != 3 {
		t.Errorf("after a warm: %+v, want 3 layers fetched and mounted", st)
	}
	view, release, err := c.View(ctx, layers)
	if err != nil {
		t.Fatal(err)
	}
	checkFiles(t, view, wantThree)
	release()
	if st := c.Stats(); st.Fetches != 3 {
		t.Errorf("the view after a warm fetched %d layers more", st.Fetches-3)
	}
	gcAndCheckEmpty(t, c, e.dir)
}
