package function

import (
	"context"
	"io"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero/api"
	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
)

// instance is a module instantiated ahead of a call with its start
// function not yet run. Everything a call varies is reached through
// indirections fixed at instantiation and pointed at the call's values
// when the instance is checked out (bind): standard streams, the two
// mounts, the sleep function, the memory limit and the room for the stack
// and tables; args and environment come from the call's context
// (wasi.go). An instance serves one call.
type instance struct {
	mod    api.Module
	start  api.Function
	mem    linearMemory // nil if the module has no memory
	acct   account
	live   *atomic.Int64 // the runtime's count of live instances
	stdin  swapReader
	stdout swapWriter
	stderr swapWriter
	root   delegateFS // mounted at /
	work   delegateFS // mounted at /workspace
	sleep  sleeper
}

func newInstance() *instance {
	inst := &instance{}
	inst.root.FS = experimentalsys.UnimplementedFS{}
	inst.work.FS = experimentalsys.UnimplementedFS{}
	return inst
}

// close releases the instance (and its memory) if the call did not. It
// may be called more than once.
func (inst *instance) close() {
	if inst.mod == nil {
		return
	}
	_ = inst.mod.Close(context.Background()) // closing an instance does not fail
	inst.mod = nil
	if inst.live != nil {
		inst.live.Add(-1)
	}
}

// swapReader reads from r, or reports end of input without one.
type swapReader struct{ r io.Reader }

func (s *swapReader) Read(p []byte) (int, error) {
	if s.r == nil {
		return 0, io.EOF
	}
	return s.r.Read(p)
}

// swapWriter writes to w, or discards without one.
type swapWriter struct{ w io.Writer }

func (s *swapWriter) Write(p []byte) (int, error) {
	if s.w == nil {
		return len(p), nil
	}
	return s.w.Write(p)
}

// delegateFS forwards to the file system of the call the instance serves.
type delegateFS struct {
	experimentalsys.FS
}

// sleeper is the instance's nanosleep: it returns early when the call ends
// so that a sleeping guest notices its timeout (wazero's own sleep cannot
// be interrupted).
type sleeper struct {
	done <-chan struct{}
}

func (s *sleeper) sleep(ns int64) {
	if ns <= 0 {
		return
	}
	t := time.NewTimer(time.Duration(ns))
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.done:
	}
}
