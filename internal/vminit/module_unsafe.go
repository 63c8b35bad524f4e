//go:build linux

package vminit

import (
	"runtime"
	"syscall"
	"unsafe"
)

// sysFinitModule is finit_module's number per architecture (package
// syscall predates the call and lacks SYS_FINIT_MODULE).
var sysFinitModule = map[string]uintptr{"amd64": 313, "arm64": 273, "riscv64": 273}[runtime.GOARCH]

// finitModule loads the kernel module in the open file fd with no
// parameters (finit_module(2)), through package syscall: only
// internal/sys may import golang.org/x/sys/unix, and this is the one call the
// guest init needs beyond package syscall.
func finitModule(fd int) error {
	if sysFinitModule == 0 {
		return syscall.ENOSYS
	}
	params := [1]byte{0}
	_, _, errno := syscall.Syscall(sysFinitModule, uintptr(fd), uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		return errno
	}
	return nil
}
