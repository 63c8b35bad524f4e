package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// stepSandbox is a fake whose state is a counter that "write" commands
// bump; it tracks steps by that counter.
type stepSandbox struct {
	*fakeSandbox

	mu     sync.Mutex // guards following fields
	state  int
	begins int
}

func (s *stepSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (api.ExecResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(req.Cmd) > 0 && req.Cmd[0] == "write" {
		s.state++
	}
	return api.ExecResult{Stdout: "ok"}, nil
}

func (s *stepSandbox) BeginStep(ctx context.Context) (sandbox.StepMark, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.begins++
	return sandbox.StepMark{Tree: [32]byte{byte(s.state)}}, nil
}

func (s *stepSandbox) EndStep(ctx context.Context, m sandbox.StepMark) (bool, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pure, why := sandbox.CompareMarks(m, sandbox.StepMark{Tree: [32]byte{byte(s.state)}})
	return pure, why, nil
}

func (s *stepSandbox) tracked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.begins
}

// TestExecStep checks ExecStep over the wire: the tier's verdict comes
// back with the result; a plain Exec costs no mark; a tier that cannot
// track steps runs the command and says the step was not tracked.
func TestExecStep(t *testing.T) {
	nc, _ := testenv.NATS(t)
	rt := newFakeRuntime(api.TierContainer)
	var sbs []*stepSandbox
	var mu sync.Mutex
	rt.wrap = func(f *fakeSandbox) sandbox.Sandbox {
		s := &stepSandbox{fakeSandbox: f}
		mu.Lock()
		sbs = append(sbs, s)
		mu.Unlock()
		return s
	}
	plain := newFakeRuntime(api.TierMicroVM)
	plain.wrap = func(f *fakeSandbox) sandbox.Sandbox { return &stepSandboxNoTrack{f} }
	reg := sandbox.NewRegistry()
	for _, r := range []sandbox.Runtime{rt, plain} {
		if err := reg.Register(r); err != nil {
			t.Fatal(err)
		}
	}
	lab := &labeler{}
	a, err := New(Options{ID: "n1", Registry: reg, Heartbeat: time.Hour, Steps: lab})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	hb := &beats{}
	if err := a.Start(ctx, nc, hb); err != nil {
		t.Fatal(err)
	}
	defer a.Stop(context.Background(), hb)
	c := noderpc.NewClient(nc)
	if err := c.Create(ctx, "n1", noderpc.CreateRequest{ID: "sb", Tier: api.TierContainer, Image: dirImage(t)}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, "n1", noderpc.CreateRequest{ID: "vm", Tier: api.TierMicroVM, Image: dirImage(t)}); err != nil {
		t.Fatal(err)
	}
	sb := sbs[0]

	if res, err := c.Exec(ctx, "n1", "sb", api.ExecRequest{Cmd: []string{"write"}}, nil); err != nil || res.Stdout != "ok" {
		t.Fatalf("Exec: %+v %v", res, err)
	}
	if n := sb.tracked(); n != 0 {
		t.Fatalf("a plain Exec marked the sandbox %d times", n)
	}
	for _, tc := range []struct {
		cmd  string
		pure bool
	}{{"read", true}, {"write", false}, {"read", true}} {
		res, info, err := c.ExecStep(ctx, "n1", "sb", 3, api.ExecRequest{Cmd: []string{tc.cmd}}, nil)
		if err != nil || res.Stdout != "ok" {
			t.Fatalf("ExecStep %s: %+v %v", tc.cmd, res, err)
		}
		want := noderpc.StepInfo{Tracked: true, Pure: tc.pure}
		if !tc.pure {
			want.Why = sandbox.WhyWrites
		}
		if info != want {
			t.Errorf("ExecStep %s: %+v, want %+v", tc.cmd, info, want)
		}
	}
	// Streamed output too.
	if _, info, err := c.ExecStep(ctx, "n1", "sb", 4, api.ExecRequest{Cmd: []string{"write"}}, &noderpc.Output{}); err != nil || info.Pure || !info.Tracked {
		t.Errorf("streamed ExecStep: %+v %v", info, err)
	}
	res, info, err := c.ExecStep(ctx, "n1", "vm", 5, api.ExecRequest{Cmd: []string{"read"}}, nil)
	if err != nil || res.Stdout != "ok" {
		t.Fatalf("ExecStep on a tier without tracking: %+v %v", res, err)
	}
	if info.Tracked || info.Pure || !strings.Contains(info.Why, "microvm") {
		t.Errorf("ExecStep on a tier without tracking: %+v, want not tracked, naming the tier", info)
	}
	// The steps reach the audit labeler: ExecStep's, and Exec's through
	// WithStep; a destroy forgets them.
	if _, err := c.Exec(noderpc.WithStep(ctx, 9), "n1", "sb", api.ExecRequest{Cmd: []string{"read"}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Destroy(ctx, "n1", "sb"); err != nil {
		t.Fatal(err)
	}
	lab.mu.Lock()
	defer lab.mu.Unlock()
	if want := []string{"sb:3", "sb:3", "sb:3", "sb:4", "vm:5", "sb:9", "forget sb"}; !slices.Equal(lab.seen, want) {
		t.Errorf("labeler saw %v, want %v", lab.seen, want)
	}
}

// labeler records what the node tells the audit recorder.
type labeler struct {
	mu   sync.Mutex // guards following fields
	seen []string
}

func (l *labeler) SetStep(id string, step int, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, fmt.Sprintf("%s:%d", id, step))
}

func (l *labeler) ForgetSteps(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, "forget "+id)
}

// stepSandboxNoTrack runs commands but cannot track steps.
type stepSandboxNoTrack struct{ *fakeSandbox }

func (s *stepSandboxNoTrack) Exec(ctx context.Context, req sandbox.ExecRequest) (api.ExecResult, error) {
	return api.ExecResult{Stdout: "ok"}, nil
}
