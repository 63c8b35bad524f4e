//go:build linux

package agent_test

import (
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agent"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
)

// TestPhaseRefusedOutsideVM checks that an agent not started with
// Options.Phases (a container's) neither announces CapPhase nor applies
// a phase: there the host does. Control: the same agent serves exec, so
// the refusal is the operation's.
func TestPhaseRefusedOutsideVM(t *testing.T) {
	c, r := newAgent(t, agent.Options{})
	ctx := ctxT(t, 30*time.Second)
	if res := run(t, c, agentproto.ExecRequest{Argv: []string{"true"}}); res.ExitCode != 0 {
		t.Fatalf("control: true = %+v", res)
	}
	if _, err := c.Phase(ctx, agentproto.PhaseArgs{Writable: []string{}}); !errors.Is(err, errdefs.Unsupported) {
		t.Errorf("Phase on a container's agent: err = %v, want Unsupported", err)
	}
	conn, err := net.Dial("unix", r.socket)
	if err != nil {
		t.Fatal(err)
	}
	c2 := agentproto.NewClient(conn, nil)
	defer c2.Close()
	h, err := c2.Hello(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(h.Capabilities, agentproto.CapPhase) || !slices.Contains(h.Capabilities, agentproto.CapExec) {
		t.Errorf("Hello capabilities = %v: want exec, not phase", h.Capabilities)
	}
}
