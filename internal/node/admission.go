package node

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Admission: a node starts only a few sandboxes of a tier at once, and
// lets a bounded number of creates wait for their turn. Starting a
// sandbox is CPU work on the node (a fork into new namespaces, mounts,
// the guest agent's setup; a VM's boot): on 2 cores, 2,000 starts at once
// made every one of them slow (past its 30 s readiness deadline), ran the
// node out of descriptors, and left failed creates half cleaned up, while
// 8 at a time went ~5 times faster. A create that would wait longer than
// StartLimits.Wait for its turn is refused at once, before anything is
// made, with errdefs.RateLimited "overloaded" and the time after which
// the queue should have room (the API's 429 + Retry-After); one whose
// wait runs out in the queue is refused the same way.

// CodeOverloaded is the code of a create refused by a node's admission.
const CodeOverloaded = api.CodeOverloaded

// StartLimits bound a tier's creates on one node. Zero fields take the
// tier's defaults (DefaultStartLimits).
type StartLimits struct {
	// Slots is how many creates run at once.
	Slots int
	// Queue caps the creates waiting for a slot.
	Queue int
	// Wait is the longest a create waits for a slot. A create whose
	// expected wait (the queue ahead of it, at the measured pace) is
	// longer is refused at once.
	Wait time.Duration
}

// DefaultStartLimits are a tier's limits on a node with cpus CPUs. The
// container tier's 4 per CPU is where a start's waits (forks, mounts,
// the guest agent's greeting) are covered and the cores busy: on 2 cores,
// creates 8 at a time went ~150/s, all at once 28/s (docs/bench.md). A
// VM's boot keeps a core busy; a function sandbox is an instance of a
// compiled module, cheap enough to start many at once.
func DefaultStartLimits(tier string, cpus int) StartLimits {
	cpus = max(cpus, 1)
	l := StartLimits{Queue: 4096, Wait: 10 * time.Second}
	switch tier {
	case api.TierFunction:
		l.Slots = 8 * cpus
	case api.TierContainer:
		l.Slots = 4 * cpus
	default:
		l.Slots = cpus
	}
	return l
}

// withDefaults fills l's zero fields from tier's defaults.
func (l StartLimits) withDefaults(tier string) StartLimits {
	d := DefaultStartLimits(tier, runtime.NumCPU())
	if l.Slots <= 0 {
		l.Slots = d.Slots
	}
	if l.Queue <= 0 {
		l.Queue = d.Queue
	}
	if l.Wait <= 0 {
		l.Wait = d.Wait
	}
	return l
}

// gate admits one tier's creates. It is safe for concurrent use.
type gate struct {
	node string
	tier string
	lim  StartLimits
	// slots holds a token per create running; a buffered channel hands a
	// freed slot to the longest-waiting sender, so the queue is FIFO.
	slots chan struct{}

	mu      sync.Mutex // guards following fields
	waiting int
	// pace is a moving average of how long a create holds its slot; 0
	// until one has finished.
	pace time.Duration
	// booked is when the last refused create was told to come back (see
	// refusalLocked).
	booked time.Time
}

func newGate(node, tier string, lim StartLimits) *gate {
	lim = lim.withDefaults(tier)
	return &gate{node: node, tier: tier, lim: lim, slots: make(chan struct{}, lim.Slots)}
}

// enter waits for a slot and returns the function that frees it. It
// fails with an errdefs.RateLimited error if the create would wait too
// long, or with ctx's error.
func (g *gate) enter(ctx context.Context) (leave func(), err error) {
	select {
	case g.slots <- struct{}{}:
		return g.leaver(), nil
	default:
	}
	g.mu.Lock()
	ahead := g.waiting
	expect := g.expectedLocked(ahead + 1)
	if ahead >= g.lim.Queue || expect > g.lim.Wait {
		// Room comes once enough of those ahead have started.
		err := g.refusalLocked(ahead, expect-g.lim.Wait)
		g.mu.Unlock()
		return nil, err
	}
	g.waiting++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.waiting--
		g.mu.Unlock()
	}()
	t := time.NewTimer(g.lim.Wait)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
		return g.leaver(), nil
	case <-t.C:
		g.mu.Lock()
		defer g.mu.Unlock()
		return nil, g.refusalLocked(g.waiting-1, 0)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// expectedLocked is how long the n-th create in the queue should wait
// at the measured pace (0 while there is no measure: the queue's cap and
// Wait then bound it).
//
// Preconditions: g.mu must be held.
func (g *gate) expectedLocked(n int) time.Duration {
	return time.Duration(n) * g.pace / time.Duration(g.lim.Slots)
}

// maxRetryHint bounds a refusal's retry hint (clients give up on much
// longer ones).
const maxRetryHint = 30 * time.Second

// refusalLocked is the error of a create refused with waiting ahead of
// it, whose place in the queue should come free after excess. Each
// refusal books the next start's worth of time after those booked
// before it, so that a crowd refused together is told to come back
// spread over the time the node needs to start them, each about when
// the queue has room for it, rather than all at once to be refused
// again. The hint is three quarters of that: a client back early costs
// another refusal, one back late leaves the node idle (measured: told
// too long a wait, a burst's clients left the node idle for a third of
// its time).
//
// Preconditions: g.mu must be held.
func (g *gate) refusalLocked(waiting int, excess time.Duration) error {
	now := time.Now()
	if at := now.Add(max(excess, 0)); g.booked.Before(at) {
		g.booked = at
	}
	g.booked = g.booked.Add(g.expectedLocked(1))
	hint := min(max(g.booked.Sub(now)*3/4, time.Second), maxRetryHint)
	return &errdefs.Error{Class: errdefs.RateLimited, Code: CodeOverloaded,
		Msg: fmt.Sprintf("node %s is starting as many %s sandboxes as it can (%d at once, %d waiting): nothing was created; retry later",
			g.node, g.tier, g.lim.Slots, waiting),
		RetryAfter: hint}
}

// leaver returns the function that frees the slot taken now and adds how
// long it was held to the pace.
func (g *gate) leaver() func() {
	start := time.Now()
	var once sync.Once
	return func() {
		once.Do(func() {
			d := time.Since(start)
			g.mu.Lock()
			if g.pace == 0 {
				g.pace = d
			} else {
				g.pace += (d - g.pace) / 8
			}
			g.mu.Unlock()
			<-g.slots
		})
	}
}

// gateFor returns tier's gate, making it on first use.
func (a *Service) gateFor(tier string) *gate {
	a.gmu.Lock()
	defer a.gmu.Unlock()
	g := a.gates[tier]
	if g == nil {
		g = newGate(a.opt.ID, tier, a.opt.Starts)
		a.gates[tier] = g
	}
	return g
}

// CodeResourcesExhausted is the code of a create that failed because the
// node ran out of descriptors, processes or memory for a moment.
const CodeResourcesExhausted = api.CodeNodeResourcesExhausted

// transient makes the error of a failed create retryable where its cause
// is the node's momentary state: descriptors, processes or memory ran out
// (EMFILE, ENFILE, EAGAIN, ENOMEM). The create was undone; another may
// succeed once other creates have finished.
func transient(err error) error {
	if errdefs.ClassOf(err) != errdefs.Internal {
		return err
	}
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.EAGAIN, syscall.ENOMEM} {
		if errors.Is(err, errno) {
			return &errdefs.Error{Class: errdefs.Unavailable, Code: CodeResourcesExhausted,
				Msg: "the node ran short of resources to start the sandbox: nothing was created; retry later", Cause: err, RetryAfter: time.Second}
		}
	}
	return err
}
