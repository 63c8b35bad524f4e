package container

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/dsec-dev/dsec/internal/agentsandbox"
	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/guest/setup"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Idle agents: warm sandboxes of no image yet. An idle agent is a
// sandbox's first process started and set up as far as it can be without
// a root (namespaces, cgroups, its loopback network, the Go runtime),
// then waiting on the node's first connection (setup.Waiting). A claim
// makes the image's root (newRoot), hands it over with the sandbox's
// hostname, /etc files and environment (setup.RootMessage), and the agent
// attaches it, builds /proc, /dev and /sys, pivots, drops its privileges
// and answers the node's greeting, as a cold start does from there.
//
// So any image whose sandboxes a warm one could be made into (no network
// of the node's, no capabilities for commands: warmKey) can be served,
// the children of a fork included, whose image is new (the parent's with
// a state layer on top): their creates bind idle agents instead of
// starting cold. Sets are per agent binary (the layer holding it):
// the binary that waits is the one a cold start would have run.
//
// Nothing but the trusted agent runs in an idle sandbox before its claim;
// it holds its capabilities until its root is attached, as a cold start's
// setup does.

// takeIdle takes an idle agent that can run spec, or returns nil.
func (r *Runtime) takeIdle(ctx context.Context, spec sandbox.Spec) *Sandbox {
	if r.warm.agents <= 0 {
		return nil
	}
	l, ok := r.guestLayer(ctx, spec.Image.Layers)
	if !ok {
		return nil
	}
	key := "agent:" + l.ID + "@" + l.Manifest.Blob.Digest
	return r.takeWarm(key, sandbox.Spec{Image: sandbox.Image{Name: spec.Image.Name, Layers: []layerspec.Layer{l}}}, true, r.warm.agents)
}

// guestLayer returns the layer findGuest takes the agent from.
func (r *Runtime) guestLayer(ctx context.Context, layers []layerspec.Layer) (layerspec.Layer, bool) {
	_, i, release, err := r.findGuestLayer(ctx, layers)
	if err != nil {
		return layerspec.Layer{}, false
	}
	release()
	return layers[i], true
}

// pendingRoot is an idle agent's end of the node's first connection,
// and its sync pipe (where a setup that fails says why).
type pendingRoot struct {
	conn  net.Conn
	syncR *os.File
}

func (p *pendingRoot) close() {
	p.conn.Close()
	p.syncR.Close()
}

// buildIdle starts an idle agent of the agent binary in spec's layers
// (spec is a set's template with its ID).
func (r *Runtime) buildIdle(ctx context.Context, spec sandbox.Spec) (*Sandbox, error) {
	var cu cleanup.Stack
	defer cu.Clean()
	dir, st, guestExe, releaseGuest, err := r.prepare(ctx, spec, true, &cu)
	if err != nil {
		return nil, err
	}
	defer releaseGuest()
	// The least CPU weight, as a warm sandbox's (build).
	limits := r.limits(spec)
	limits.CPUWeight = 2
	cg, err := r.newCgroups(ctx, spec.ID, limits, &cu)
	if err != nil {
		return nil, err
	}
	st.CgroupBase = cg.Base()
	cfg, err := r.firstConfig(dir, spec, &network.Endpoint{})
	if err != nil {
		return nil, err
	}
	cfg.Deferred = true
	if st.Owner, err = r.takeOwner(&cu); err != nil {
		return nil, err
	}
	run, err := r.startFirst(ctx, guestExe, dir, "", cg, cfg, nil, st.Owner, &cu)
	if err != nil {
		return nil, startError(ctx, spec.ID, err)
	}
	pending := &pendingRoot{conn: run.conn, syncR: run.syncR}
	st.Pid = run.pid
	if err := st.write(dir); err != nil {
		pending.close()
		return nil, err
	}
	cu.Release()
	return &Sandbox{rt: r, id: spec.ID, dir: dir, state: st, agent: agentsandbox.NewAgent(Tier, spec.ID, nil), cg: cg, wait: run.wait,
		releaseRoot: func() {}, pending: pending}, nil
}

// bindIdle makes the idle agent sb into the sandbox spec: its name and
// limits as a warm sandbox's (rename), then its root, which the agent
// attaches before it answers. On error sb is left for the caller to
// destroy.
func (r *Runtime) bindIdle(ctx context.Context, sb *Sandbox, spec sandbox.Spec) error {
	if err := r.rename(ctx, sb, spec); err != nil {
		return err
	}
	var cu cleanup.Stack
	defer cu.Clean()
	root, err := r.newRoot(ctx, sb.dir, spec, &cu)
	if err != nil {
		return err
	}
	defer root.fd.Close()
	cfg := identity(spec.ID, &network.Endpoint{})
	cfg.Rootfs, cfg.SockDir = root.path, filepath.Join(sb.dir, "sock")
	msg, err := setup.RootMessage(cfg)
	if err != nil {
		return err
	}
	p := sb.pending
	uc, ok := p.conn.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("the agent's connection is a %T", p.conn)
	}
	if _, _, err := uc.WriteMsgUnix(msg, sys.UnixRights(int(root.fd.Fd())), nil); err != nil {
		return fmt.Errorf("handing the agent its root: %w", err)
	}
	// From here the sandbox holds the root, and Destroy lets it go (after
	// the kill), and closes the connection, through the agent.
	cu.Release()
	sb.releaseRoot = root.release
	sb.umu.Lock()
	sb.upper, sb.upperDir = root.upper, root.upperDir
	sb.umu.Unlock()
	client := agentproto.NewClient(p.conn, r.log)
	sb.pending = nil
	sb.agent = agentsandbox.NewAgent(Tier, spec.ID, client)
	if _, err := client.Hello(ctx); err != nil {
		err = fmt.Errorf("%w (console: %s)", setupError(p.syncR, err), consoleTail(sb.dir))
		p.syncR.Close()
		return err
	}
	p.syncR.Close()
	st := *sb.state
	st.Rootfs = root.path
	if err := st.write(sb.dir); err != nil {
		return err
	}
	sb.state = &st
	return nil
}
