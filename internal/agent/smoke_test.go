//go:build linux

package agent_test

import (
	"testing"

	"github.com/dsec-dev/dsec/internal/agent"
	"github.com/dsec-dev/dsec/internal/agentproto"
)

func TestSmoke(t *testing.T) {
	c, _ := newAgent(t, agent.Options{})
	res := run(t, c, agentproto.ExecRequest{Argv: []string{"echo", "hello"}})
	t.Logf("%+v", res)
	res = run(t, c, agentproto.ExecRequest{Argv: sh("cat; echo err >&2; exit 3"), Stdin: "in\n"})
	t.Logf("%+v", res)
}
