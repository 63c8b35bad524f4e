package vmm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// consoleTail is how much of the serial console a boot failure carries.
const consoleTail = 2048

var errVMExited = errors.New("the VM exited during boot")

// WaitReady is the boot watchdog. It calls ready, which must block until
// the guest is ready (e.g. dsec-guest answered on the agent socket) and
// return early with its context's error when that context ends. If ready
// fails, the VM exits first, or timeout passes, WaitReady kills the VM,
// removes its serial log and returns:
//
//   - errdefs.DeadlineExceeded with code CodeBootTimeout on timeout;
//   - errdefs.Unavailable with code CodeBootFailed if the VM exited or
//     ready failed;
//   - ctx's error if ctx ended first.
//
// The error's cause carries the end of the serial console, for logs. A boot
// under TCG was once seen to hang forever (docs/machine.md, "Virtualisation"):
// every boot needs this watchdog.
func (vm *VM) WaitReady(ctx context.Context, ready func(context.Context) error, timeout time.Duration) error {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	rctx, cancelT := context.WithTimeoutCause(rctx, timeout, context.DeadlineExceeded)
	defer cancelT()
	go func() {
		select {
		case <-vm.exited:
			cancel(errVMExited)
		case <-rctx.Done():
		}
	}()
	err := ready(rctx)
	if err == nil {
		return nil
	}
	cause := context.Cause(rctx)
	var out error
	switch {
	case ctx.Err() != nil:
		out = ctx.Err()
	case errors.Is(cause, errVMExited):
		out = errdefs.New(errdefs.Unavailable, CodeBootFailed, "%s exited during boot", vm.cfg.label())
	case errors.Is(cause, context.DeadlineExceeded):
		out = errdefs.New(errdefs.DeadlineExceeded, CodeBootTimeout, "%s did not become ready within %v", vm.cfg.label(), timeout)
	default:
		out = errdefs.Wrap(errdefs.Unavailable, CodeBootFailed, err, "%s did not become ready", vm.cfg.label())
	}
	// Read the console before the kill removes it.
	vm.kill()
	tail := logTail(vm.SerialLog(), consoleTail)
	removeLog(vm.SerialLog())
	var e *errdefs.Error
	if errors.As(out, &e) {
		e.Cause = errors.Join(e.Cause, fmt.Errorf("serial console ends with %q", tail))
	}
	return out
}
