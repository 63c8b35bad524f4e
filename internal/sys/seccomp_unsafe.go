//go:build linux

package sys

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxFilterInsns is BPF_MAXINSNS: the kernel refuses longer filters.
const maxFilterInsns = 4096

// InstallSeccompFilter sets no_new_privs and installs prog, a classic BPF
// program as raw struct sock_filter entries (8 bytes each, native byte
// order), as a seccomp filter on every thread of the process
// (SECCOMP_FILTER_FLAG_TSYNC); children inherit both.
//
// Both calls run on one locked OS thread: no_new_privs is per thread, and
// seccomp(2) refuses a caller without it (or CAP_SYS_ADMIN). TSYNC then
// copies the filter and no_new_privs to the other threads.
func InstallSeccompFilter(prog []byte) error {
	n := len(prog) / 8
	if len(prog) == 0 || len(prog)%8 != 0 || n > maxFilterInsns {
		return fmt.Errorf("a seccomp filter of %d bytes is not 1–%d instructions", len(prog), maxFilterInsns)
	}
	insns := make([]unix.SockFilter, n)
	for i := range insns {
		b := prog[8*i:]
		insns[i] = unix.SockFilter{
			Code: binary.NativeEndian.Uint16(b[0:2]),
			Jt:   b[2],
			Jf:   b[3],
			K:    binary.NativeEndian.Uint32(b[4:8]),
		}
	}
	fprog := unix.SockFprog{Len: uint16(n), Filter: &insns[0]}

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	r, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(insns)
	if errno != 0 {
		return fmt.Errorf("installing the seccomp filter: %w", errno)
	}
	if r != 0 {
		// With TSYNC a positive result is the id of a thread that could
		// not be synchronised (it runs a filter not in our ancestry).
		return fmt.Errorf("installing the seccomp filter: thread %d cannot be synchronised", r)
	}
	return nil
}
