package daemon

import (
	"context"
	"testing"

	"github.com/dsec-dev/dsec/api"
)

// TestForkDoesNotRunPlantedAgent: a sandbox that writes its own program
// where images keep the agent, then forks, must not have its children
// set up by that program (the first process of a sandbox runs with every
// capability of its namespaces and before its seccomp filter). The
// children's agent comes from the image's layers, never from a state
// layer; the planted file is an ordinary file of the children's tree.
func TestForkDoesNotRunPlantedAgent(t *testing.T) {
	u := startContainers(t)
	ctx := context.Background()
	c := u.c
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.DeleteSandbox(context.Background(), sb.ID) }()
	const plant = "printf '#!/bin/sh\\necho planted agent ran\\nexit 7\\n' > /opt/dsec/bin/dsec-guest && chmod 755 /opt/dsec/bin/dsec-guest"
	if res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Command: plant}); err != nil || res.ExitCode != 0 {
		t.Fatalf("planting: %+v, %v", res, err)
	}
	fr, err := c.Fork(ctx, sb.ID, api.ForkRequest{Count: 1})
	if err != nil {
		t.Fatalf("fork of a sandbox that planted an agent: %v", err)
	}
	kid := fr.Sandboxes[0].ID
	defer func() { _ = c.DeleteSandbox(context.Background(), kid) }()
	res, err := c.Exec(ctx, kid, api.ExecRequest{Command: "head -c 9 /opt/dsec/bin/dsec-guest"})
	if err != nil || res.ExitCode != 0 || res.Stdout != "#!/bin/sh" {
		t.Fatalf("the child's copy of the planted file: %+v, %v", res, err)
	}
}
