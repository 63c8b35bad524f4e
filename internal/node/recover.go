package node

import (
	"context"
	"fmt"
)

// recover rebuilds the service's view of its sandboxes after a restart:
// first it re-acquires the image views its sandboxes held (adopting the
// mounts that outlived the previous agent), then the runtimes re-adopt
// their sandboxes, then whatever no sandbox claims is released and the
// layer cache collects it.
func (a *Service) recover(ctx context.Context) error {
	a.mu.Lock()
	a.recovering, a.early = true, map[string]bool{}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.recovering, a.early = false, nil
		a.mu.Unlock()
	}()
	held := map[string]func(){}
	if a.opt.Layers != nil {
		st, err := openState(a.opt.StateDir)
		if err != nil {
			return err
		}
		a.state = st
		for id, s := range st.all() {
			_, release, err := a.opt.Layers.View(ctx, cacheLayers(s.Image))
			if err != nil {
				a.log.Warn("re-acquiring a sandbox's image", "sandbox", id, "err", err)
				st.remove(id)
				continue
			}
			held[id] = a.releaser(id, release)
		}
	}
	for _, rt := range a.opt.Registry.All() {
		a.watchEnds(rt)
	}
	for _, rt := range a.opt.Registry.All() {
		sbs, err := rt.Recover(ctx)
		if err != nil {
			return fmt.Errorf("recovering %s sandboxes: %w", rt.Tier(), err)
		}
		a.mu.Lock()
		for _, sb := range sbs {
			release := held[sb.ID()]
			delete(held, sb.ID())
			if release == nil {
				release = func() {}
			}
			if a.early[sb.ID()] {
				// It ended while being adopted (reported already).
				defer release()
				continue
			}
			a.sandboxes[sb.ID()] = &entry{tier: rt.Tier(), sb: sb, release: release}
		}
		a.mu.Unlock()
		if len(sbs) > 0 {
			a.log.Info("re-adopted sandboxes", "tier", rt.Tier(), "count", len(sbs))
		}
	}
	for _, release := range held {
		release() // the runtime lost it: nothing uses the view any more
	}
	if a.opt.Layers != nil {
		if err := a.opt.Layers.GC(ctx); err != nil {
			a.log.Warn("collecting unused layers", "err", err)
		}
	}
	return nil
}
