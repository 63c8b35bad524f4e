package node

import (
	"context"
	"time"

	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Sandboxes that end by themselves. A runtime that notices them
// (sandbox.EndNotifier: a container whose agent died, a VM whose guest
// panicked or powered off) releases the sandbox and calls ended; the
// node forgets it, frees its image view and reports it to the control
// plane (noderpc.ReportEnded), which fails its record with the reason.

// reportTimeout bounds the retries of one report: past it, the control
// plane's reconciliation fails the record ("lost") instead.
const reportTimeout = time.Minute

// shutdownReports bounds all the reports of a node's stop together.
const shutdownReports = 15 * time.Second

// watchEnds makes rt report its sandboxes' ends to the node, if it can.
func (a *Service) watchEnds(rt sandbox.Runtime) {
	if n, ok := rt.(sandbox.EndNotifier); ok {
		tier := rt.Tier()
		n.OnEnd(func(e sandbox.Ended) { a.ended(tier, e) })
	}
}

// stopEnds stops the runtimes' reports (Stop).
func (a *Service) stopEnds() {
	for _, rt := range a.opt.Registry.All() {
		if n, ok := rt.(sandbox.EndNotifier); ok {
			n.OnEnd(nil)
		}
	}
	a.mu.Lock()
	a.stopped = true
	a.mu.Unlock()
}

// ended handles sandbox end.ID of tier, which ended by itself and which
// its runtime has released.
func (a *Service) ended(tier string, end sandbox.Ended) {
	a.mu.Lock()
	e, ok := a.sandboxes[end.ID]
	switch {
	case ok && e.sb == nil:
		// Its Create has not returned: it fails instead (see Create).
		e.ended = &end
		a.mu.Unlock()
		return
	case ok:
		delete(a.sandboxes, end.ID)
	case a.recovering:
		// Adopted by its runtime, not yet by the node: recover drops it.
		a.early[end.ID] = true
	}
	stopped := a.stopped
	if !stopped {
		a.wg.Add(1)
	}
	a.mu.Unlock()
	a.endSessions(end.ID)
	if ok {
		e.release()
	}
	if stopped {
		return
	}
	go func() {
		defer a.wg.Done()
		a.report(tier, end)
	}()
}

// report tells the control plane that a sandbox ended by itself.
func (a *Service) report(tier string, end sandbox.Ended) {
	a.reportWithin(a.bg, tier, end)
}

// reportWithin is report bounded by ctx too.
func (a *Service) reportWithin(ctx context.Context, tier string, end sandbox.Ended) {
	if a.nc == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, reportTimeout)
	defer cancel()
	r := noderpc.EndedReport{Node: a.opt.ID, ID: end.ID, Tier: tier, Reason: end.Reason(), Time: time.Now().UTC()}
	if err := noderpc.ReportEnded(ctx, a.nc, r); err != nil {
		a.log.Warn("reporting a sandbox that ended by itself", "sandbox", end.ID, "err", err)
	}
}
