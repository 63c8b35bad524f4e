package function

import (
	"context"
	"sync"
)

// gate counts operations in progress and lets a closer refuse new ones and
// wait for the rest. It is safe for concurrent use.
type gate struct {
	mu     sync.Mutex // guards following fields
	n      int
	closed bool
	idle   chan struct{} // closed when closed and n == 0
	// held is set while a holder keeps operations off (a snapshot);
	// closed when it lets them in again. drained is closed when held
	// and n == 0.
	held, drained chan struct{}
}

// enter starts an operation; it reports false once the gate is closed.
// While the gate is held it waits.
func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.held != nil && !g.closed {
		h := g.held
		g.mu.Unlock()
		<-h
		g.mu.Lock()
	}
	if g.closed {
		return false
	}
	g.n++
	return true
}

// leave ends an operation started by a successful enter.
func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	if g.closed && g.n == 0 {
		g.closeIdleLocked()
	}
	if g.drained != nil && g.n == 0 {
		close(g.drained)
		g.drained = nil
	}
}

// hold keeps new operations waiting and waits for those in progress to
// end, within ctx; release lets them in again. Holds do not nest: a
// second waits for the first's release. It reports false once the gate
// is closed.
func (g *gate) hold(ctx context.Context) (release func(), ok bool, err error) {
	g.mu.Lock()
	for g.held != nil && !g.closed {
		h := g.held
		g.mu.Unlock()
		select {
		case <-h:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		g.mu.Lock()
	}
	if g.closed {
		g.mu.Unlock()
		return nil, false, nil
	}
	held := make(chan struct{})
	g.held = held
	var drained chan struct{}
	if g.n > 0 {
		drained = make(chan struct{})
		g.drained = drained
	}
	g.mu.Unlock()
	release = func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.held == held {
			g.held, g.drained = nil, nil
			close(held)
		}
	}
	if drained != nil {
		select {
		case <-drained:
		case <-ctx.Done():
			release()
			return nil, false, ctx.Err()
		}
	}
	return release, true, nil
}

// close refuses new operations and returns a channel closed when none are
// in progress. It may be called more than once. Operations waiting for a
// hold's release are refused.
func (g *gate) close() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
		if g.held != nil {
			close(g.held)
			g.held = nil
		}
		g.idle = make(chan struct{})
		if g.n == 0 {
			g.closeIdleLocked()
		}
	}
	return g.idle
}

// Preconditions: g.mu must be held; g.idle is open.
func (g *gate) closeIdleLocked() {
	select {
	case <-g.idle:
	default:
		close(g.idle)
	}
}
