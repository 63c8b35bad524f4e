package function

import "sync"

// gate counts operations in progress and lets a closer refuse new ones and
// wait for the rest. It is safe for concurrent use.
type gate struct {
	mu     sync.Mutex // guards following fields
	n      int
	closed bool
	idle   chan struct{} // closed when closed and n == 0
}

// enter starts an operation; it reports false once the gate is closed.
func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
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
}

// close refuses new operations and returns a channel closed when none are
// in progress. It may be called more than once.
func (g *gate) close() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
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
