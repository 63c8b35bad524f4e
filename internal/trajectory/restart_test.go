package trajectory

import (
	"context"
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/internal/natsbus"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestSurvivesRestart: a NATS server stopped without the Store being
// closed (a crash of the writer) and started again on the same directory
// holds every acknowledged step and blob; a new Store carries on after
// the last step.
func TestSurvivesRestart(t *testing.T) {
	base := testenv.Goroutines()
	t.Cleanup(func() { testenv.GoroutinesSettle(t, base) })
	dir := t.TempDir()
	ctx := ctxT(t)
	start := func() (jetstream.JetStream, func()) {
		srv, err := natsbus.Start(ctx, natsbus.Options{StoreDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		nc, err := srv.Connect("test")
		if err != nil {
			srv.Shutdown()
			t.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js, func() { nc.Close(); srv.Shutdown() }
	}
	js, stop := start()
	s, err := Open(ctx, js, Options{})
	if err != nil {
		t.Fatal(err)
	}
	begin(t, s, "run/restart", "o")
	appendN(t, s, "run/restart", 1, 20)
	d, _, err := s.PutBlob(ctx, "run/restart", bytesReader("kept across restarts"))
	if err != nil {
		t.Fatal(err)
	}
	s.forget("run/restart") // no flush, no timer: the writer died
	stop()

	js, stop = start()
	defer stop()
	s2, err := Open(ctx, js, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close(context.Background())
	steps, err := s2.Steps(ctx, "run/restart", 0, 100)
	if err != nil || !slices.Equal(stepNumbers(steps), seq(1, 20)) {
		t.Fatalf("after the restart: steps %v, %v", stepNumbers(steps), err)
	}
	if last, ok, err := s2.Last(ctx, "run/restart"); err != nil || !ok || last.Step != 20 {
		t.Fatalf("Last = %d, %v, %v", last.Step, ok, err)
	}
	if got := readBlob(t, s2, "run/restart", d); string(got) != "kept across restarts" {
		t.Fatalf("blob = %q", got)
	}
	// The new Store learns where the log ends from the log itself.
	appendN(t, s2, "run/restart", 21, 21)
	if err := s2.Flush(ctx, "run/restart"); err != nil {
		t.Fatal(err)
	}
	if h, _, err := s2.readHead(ctx, "run/restart"); err != nil || h.Steps != 21 {
		t.Fatalf("the flushed head: %d steps, %v; want 21", h.Steps, err)
	}
}
