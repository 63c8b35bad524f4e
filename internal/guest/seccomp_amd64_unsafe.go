//go:build linux && amd64

package guest

import (
	"fmt"
	"runtime"
	"syscall"
	"unsafe"
)

const (
	prSetNoNewPrivs    = 38
	sysSeccomp         = 317 // x86_64
	seccompSetModeFilt = 1
	seccompFlagTsync   = 1
)

// installSeccomp sets no_new_privs and installs the filter on every
// thread of this process; children inherit both.
func installSeccomp(prog []byte) error {
	// no_new_privs is per thread: set it on the thread that installs the
	// filter, whose TSYNC then gives both to every other thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetNoNewPrivs, 1, 0); e != 0 {
		return fmt.Errorf("setting no_new_privs: %w", e)
	}
	if len(prog) == 0 {
		return nil
	}
	if len(prog)%8 != 0 || len(prog)/8 > 4096 {
		return fmt.Errorf("seccomp filter of %d bytes is not a filter", len(prog))
	}
	fprog := struct {
		Len    uint16
		_      [6]byte
		Filter unsafe.Pointer
	}{Len: uint16(len(prog) / 8), Filter: unsafe.Pointer(&prog[0])}
	if _, _, e := syscall.RawSyscall(sysSeccomp, seccompSetModeFilt, seccompFlagTsync, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return fmt.Errorf("installing the seccomp filter: %w", e)
	}
	return nil
}
