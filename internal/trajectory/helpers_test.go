package trajectory

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// ctxT bounds a test's calls.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newJS starts an embedded NATS server for the test; the goroutines it
// and the stores started are checked to be gone at the end.
func newJS(t testing.TB) (jetstream.JetStream, *nats.Conn) {
	t.Helper()
	base := testenv.Goroutines()
	t.Cleanup(func() { testenv.GoroutinesSettle(t, base) })
	nc, _ := testenv.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js, nc
}

// openStore opens a Store on js, closed when the test ends.
func openStore(t testing.TB, js jetstream.JetStream, opt Options) *Store {
	t.Helper()
	s, err := Open(ctxT(t), js, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

func begin(t testing.TB, s *Store, id, owner string) {
	t.Helper()
	if err := s.Begin(ctxT(t), Head{Trajectory: api.Trajectory{ID: id, Incarnations: 1}, Owner: owner}); err != nil {
		t.Fatal(err)
	}
}

// execStep is an exec-sized step: a command and a few hundred bytes of
// output.
func execStep(n int, who string) *api.TrajectoryStep {
	out := fmt.Sprintf("step %d by %s: %0300d\n", n, who, n)
	return &api.TrajectoryStep{
		Step: n, Kind: api.KindExec, At: time.Unix(1700000000, int64(n)).UTC(), Sandbox: "sb-" + who,
		Exec: &api.StepExec{
			Request:  api.ExecRequest{Cmd: []string{"sh", "-c", fmt.Sprintf("echo %d", n)}, Cwd: "/workspace"},
			ExitCode: 0, Stdout: out, OutputDigest: OutputDigest(out, ""),
		},
		Labels: map[string]string{"writer": who},
	}
}

func appendN(t testing.TB, s *Store, id string, from, to int) {
	t.Helper()
	for i := from; i <= to; i++ {
		if err := s.Append(ctxT(t), id, execStep(i, "w")); err != nil {
			t.Fatalf("append %d to %s: %v", i, id, err)
		}
	}
}

// stepNumbers lists the steps' numbers.
func stepNumbers(steps []api.TrajectoryStep) []int {
	out := make([]int, len(steps))
	for i, st := range steps {
		out[i] = st.Step
	}
	return out
}

func seq(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// subjectMsgs counts the messages stored on trajectory id's subject.
func subjectMsgs(t testing.TB, s *Store, id string) uint64 {
	t.Helper()
	info, err := s.stream.Info(ctxT(t), jetstream.WithSubjectFilter(subject(id)))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subject(id)]
}
