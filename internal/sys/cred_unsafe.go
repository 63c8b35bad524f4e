//go:build linux

package sys

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// LimitCaps limits the effective and permitted capability sets of every
// thread of the process to caps (bit c for capability c) and empties the
// inheritable set: capset(2) is per thread, so it runs on all of them
// in one stop-the-world.
func LimitCaps(caps uint64) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	lo, hi := uint32(caps), uint32(caps>>32)
	data := [2]unix.CapUserData{{Effective: lo, Permitted: lo}, {Effective: hi, Permitted: hi}}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return e
	}
	return nil
}
