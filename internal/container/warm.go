package container

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/agentsandbox"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// The warm pool: sandboxes started ahead of demand, so that a create is
// a claim. Starting the agent (the zygote's fork into new namespaces, the
// Go runtime, mounts, pivot, seccomp) is ~6 ms of a create's ~7; a claim
// renames the sandbox's directory, writes its limits, hostname and /etc
// files, and records it (well under a millisecond).
//
// What a warm sandbox may differ in is what a claim can set from the
// host: its ID (directory, hostname, /etc/hosts, the HOSTNAME variable),
// limits (cgroup files), environment (sent with every command) and times.
// What it cannot is its key: the image's layers and the disk size (the
// upper's tmpfs), and its network, so only sandboxes without network
// access (a namespace of their own, the default) are kept warm. Nothing
// but the trusted agent has run in a warm sandbox before it is claimed.
//
// Each image (key) a Create asked for keeps Warm sandboxes ready,
// refilled in the background after every claim; at most warmKeys keys,
// the least recently used dropped. A node restart destroys warm sandboxes
// (their records say so) instead of adopting them.
//
// Behind them, for the images that have none ready (a new image, a
// fork's children, whose image ends with a new state layer), are idle
// agents (idle.go): WarmAgents sandboxes per agent binary that wait for
// their root, bound to any image at a claim.

// warmKeys is how many images (and agent binaries) the pool keeps
// sandboxes for.
const warmKeys = 5

type warmPool struct {
	size   int // sandboxes kept per image
	agents int // idle agents kept per agent binary

	mu     sync.Mutex // guards the fields below
	sets   map[string]*warmSet
	closed bool
	// fills counts starts and evictions in flight (Close waits for them).
	fills sync.WaitGroup
}

type warmSet struct {
	template sandbox.Spec // the image and disk of its sandboxes
	// idle: a set of idle agents (template holds only the agent's
	// layer), size of them.
	idle    bool
	size    int
	ready   []*Sandbox
	filling int
	used    time.Time
	// broken is why the set's image cannot make a sandbox at all (an
	// Invalid error, e.g. it lacks the agent): the set is not refilled
	// again, and its claims build and fail with that error.
	broken error
}

func newWarmPool(size, agents int) *warmPool {
	if size <= 0 && agents <= 0 {
		return nil
	}
	return &warmPool{size: max(size, 0), agents: max(agents, 0), sets: map[string]*warmSet{}}
}

// warmKey returns the key of the sandboxes spec can be made from, or
// false if it cannot be made from a warm one.
func warmKey(spec sandbox.Spec) (string, bool) {
	if _, linked, err := network.Initial(spec.Network, spec.Phases); err != nil || linked {
		return "", false
	}
	// Warm sandboxes start without capabilities for commands (their
	// bounding set is empty for good).
	if len(sandbox.MaxCapabilities(spec)) > 0 {
		return "", false
	}
	var b strings.Builder
	for _, l := range spec.Image.Layers {
		b.WriteString(l.ID + "@" + l.Manifest.Blob.Digest + ",")
	}
	fmt.Fprintf(&b, "disk=%d", diskMB(spec))
	return b.String(), true
}

// claimWarm returns a warm sandbox made into spec (not yet registered),
// or nil, and has the pool refilled either way.
func (r *Runtime) claimWarm(ctx context.Context, spec sandbox.Spec) *Sandbox {
	p := r.warm
	if p == nil {
		return nil
	}
	key, ok := warmKey(spec)
	if !ok {
		return nil
	}
	sb := r.takeWarm(key, sandbox.Spec{Image: spec.Image, DiskMB: spec.DiskMB}, false, p.size)
	var err error
	if sb != nil {
		err = r.makeWarmInto(ctx, sb, spec)
		if err == nil {
			// It waited in the pool: its agent must still answer.
			err = sb.ping(ctx)
		}
	} else if sb = r.takeIdle(ctx, spec); sb != nil {
		err = r.bindIdle(ctx, sb, spec)
	}
	if sb == nil {
		return nil
	}
	if err != nil {
		r.log.Warn("claiming a warm sandbox", "sandbox", spec.ID, "err", err)
		_ = sb.Destroy(context.WithoutCancel(ctx))
		return nil
	}
	return sb
}

// takeWarm takes a ready sandbox of set key (made from template, size
// of them; idle agents if idle) or returns nil, and has the set refilled
// either way.
func (r *Runtime) takeWarm(key string, template sandbox.Spec, idle bool, size int) *Sandbox {
	p := r.warm
	if size <= 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	set := p.sets[key]
	if set == nil {
		set = &warmSet{template: template, idle: idle, size: size}
		p.sets[key] = set
		r.evictWarmLocked()
	}
	set.used = time.Now()
	var sb *Sandbox
	if n := len(set.ready); n > 0 {
		sb, set.ready = set.ready[n-1], set.ready[:n-1]
	}
	r.refillLocked(key, set)
	return sb
}

// evictWarmLocked drops the least recently used keys beyond warmKeys.
func (r *Runtime) evictWarmLocked() {
	p := r.warm
	for len(p.sets) > warmKeys {
		var oldest string
		for k, s := range p.sets {
			if oldest == "" || s.used.Before(p.sets[oldest].used) {
				oldest = k
			}
		}
		for _, sb := range p.sets[oldest].ready {
			p.fills.Add(1) // Close waits for these too
			go func() {
				defer p.fills.Done()
				_ = sb.Destroy(context.Background())
			}()
		}
		delete(p.sets, oldest)
	}
}

// fillsAtOnce is how many sandboxes a set starts at a time. A refill
// after a burst of claims (a fork's sixteen children) must not compete
// with the burst: the node's side of a start runs at full CPU weight.
const fillsAtOnce = 1

// refillLocked starts the sandboxes set lacks, fillsAtOnce at a time
// (each fill that succeeds starts the next).
func (r *Runtime) refillLocked(key string, set *warmSet) {
	p := r.warm
	for !p.closed && set.broken == nil && set.filling < fillsAtOnce && len(set.ready)+set.filling < set.size {
		set.filling++
		p.fills.Add(1)
		go r.fillWarm(key, set)
	}
}

// fillWarm starts one warm sandbox for set.
func (r *Runtime) fillWarm(key string, set *warmSet) {
	p := r.warm
	defer p.fills.Done()
	spec := set.template
	spec.ID = "warm-" + randomHex(8)
	ctx, cancel := context.WithTimeout(context.Background(), r.opt.ReadyTimeout)
	var sb *Sandbox
	var err error
	if set.idle {
		sb, err = r.buildIdle(ctx, spec)
	} else {
		sb, err = r.build(ctx, spec, true)
	}
	cancel()
	p.mu.Lock()
	set.filling--
	keep := err == nil && !p.closed && p.sets[key] == set
	if keep {
		set.ready = append(set.ready, sb)
		r.refillLocked(key, set)
	}
	// An image that cannot make a sandbox (Invalid: it lacks the agent,
	// say) is told once; other failures (a busy host) are retried at the
	// next claim.
	told := set.broken != nil
	if errdefs.ClassOf(err) == errdefs.Invalid {
		set.broken = err
	}
	broken := set.broken != nil
	p.mu.Unlock()
	switch {
	case err != nil && broken && !told:
		r.log.Warn("an image cannot start sandboxes; the warm pool keeps none of it", "image", spec.Image.Name, "err", err)
	case err != nil && !broken:
		// Not retried until the next claim: a failing image must not spin.
		r.log.Warn("starting a warm sandbox", "image", spec.Image.Name, "err", err)
	case err != nil: // told already
	case !keep:
		_ = sb.Destroy(context.Background())
	}
}

// closeWarm stops refills and destroys the warm sandboxes.
func (r *Runtime) closeWarm(ctx context.Context) {
	p := r.warm
	if p == nil {
		return
	}
	p.mu.Lock()
	p.closed = true
	var sbs []*Sandbox
	for _, s := range p.sets {
		sbs = append(sbs, s.ready...)
	}
	p.sets = map[string]*warmSet{}
	p.mu.Unlock()
	p.fills.Wait() // each destroys what it made
	for _, sb := range sbs {
		if err := sb.Destroy(ctx); err != nil {
			r.log.Warn("destroying a warm sandbox", "err", err)
		}
	}
}

// WarmReady returns how many warm sandboxes are ready (for tests and
// status).
func (r *Runtime) WarmReady() int {
	if r.warm == nil {
		return 0
	}
	r.warm.mu.Lock()
	defer r.warm.mu.Unlock()
	n := 0
	for _, s := range r.warm.sets {
		n += len(s.ready)
	}
	return n
}

// makeWarmInto gives the warm sandbox sb spec's identity and limits. On
// error sb is left for the caller to destroy.
func (r *Runtime) makeWarmInto(ctx context.Context, sb *Sandbox, spec sandbox.Spec) error {
	if err := r.rename(ctx, sb, spec); err != nil {
		return err
	}
	// The agent's process is checked to be the sandbox's (in its cgroup)
	// after its namespace and root are opened: a reused pid is not.
	pid := sb.state.Pid
	uts, err := os.Open(fmt.Sprintf("/proc/%d/ns/uts", pid))
	if err != nil {
		return err
	}
	defer uts.Close()
	root, err := os.OpenRoot(fmt.Sprintf("/proc/%d/root", pid))
	if err != nil {
		return err
	}
	defer root.Close()
	if procs, err := sb.cg.Procs(); err != nil || !slices.Contains(procs, pid) {
		return fmt.Errorf("its agent is gone")
	}
	name := agentsandbox.Hostname(spec.ID)
	if err := sys.SetHostnameIn(uts, name); err != nil {
		return err
	}
	for file, content := range map[string]string{"etc/hostname": name + "\n", "etc/hosts": agentsandbox.HostsFile(spec.ID, nil)} {
		if err := writeExisting(root, file, content); err != nil {
			return fmt.Errorf("writing /%s: %w", file, err)
		}
	}
	return sb.state.write(sb.dir)
}

// rename gives the warm sandbox sb (or idle agent) spec's ID, directory,
// cgroups and limits, and a state (not yet written) of spec's.
func (r *Runtime) rename(ctx context.Context, sb *Sandbox, spec sandbox.Spec) error {
	dir := r.sandboxDir(spec.ID)
	if err := sys.RenameNoReplace(sb.dir, dir); err != nil {
		return err
	}
	sb.dir = dir
	st := *sb.state
	st.Spec, st.Created, st.Warm, st.Prestarted = spec, time.Now().UTC(), false, true
	st.Rootfs = filepath.Join(dir, "root")
	sb.id, sb.state = spec.ID, &st
	sb.agent.Rename(spec.ID)
	// Its cgroups take its name, as every sandbox's have.
	cg, err := r.opt.Cgroups.Rename(ctx, sb.cg, spec.ID)
	if cg != nil {
		sb.cg = cg
	}
	if err != nil {
		return err
	}
	return sb.cg.Update(r.limits(spec))
}

// writeExisting replaces the content of a file that exists under root
// (one the agent wrote: it keeps the sandbox's owner).
func writeExisting(root *os.Root, name, content string) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
