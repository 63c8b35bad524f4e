package agentsandbox

import (
	"context"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Ends tells the node of the sandboxes that ended by themselves (an agent
// that died, a guest that panicked or powered off): a runtime keeps one,
// and its OnEnd (sandbox.EndNotifier) is the runtime's. The zero value
// tells no one until OnEnd. It is safe for concurrent use.
type Ends struct {
	mu sync.Mutex // guards fn
	fn func(sandbox.Ended)
}

// OnEnd sets the function told of each end (sandbox.EndNotifier).
func (e *Ends) OnEnd(fn func(sandbox.Ended)) {
	e.mu.Lock()
	e.fn = fn
	e.mu.Unlock()
}

// destroyWait bounds the release of a sandbox that ended.
const destroyWait = time.Minute

// Ended handles the end of a sandbox that nobody asked for: it releases
// the sandbox as its Destroy does (destroy, given a minute), then tells
// the node, whose record of the sandbox fails. It returns destroy's
// error, which the node is told of nevertheless (the sandbox is gone
// either way).
func (e *Ends) Ended(end sandbox.Ended, destroy func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), destroyWait)
	defer cancel()
	err := destroy(ctx)
	e.mu.Lock()
	fn := e.fn
	e.mu.Unlock()
	if fn != nil {
		fn(end)
	}
	return err
}
