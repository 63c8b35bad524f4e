package main

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

func rawSyscall(nr, a1, a2, a3 uintptr) unix.Errno {
	_, _, e := unix.Syscall(nr, a1, a2, a3)
	return e
}

func rawSyscall6(nr, a1, a2, a3, a4, a5, a6 uintptr) unix.Errno {
	_, _, e := unix.Syscall6(nr, a1, a2, a3, a4, a5, a6)
	return e
}

// strPtr returns a NUL-terminated copy of s for a system call; it stays
// reachable because the probe exits soon after.
func strPtr(s string) uintptr {
	b, _ := unix.BytePtrFromString(s)
	keep = append(keep, b)
	return uintptr(unsafe.Pointer(b))
}

var keep []*byte

// tiocsti pushes one byte into fd's terminal input; high sets bits above
// 32 in the request number (CVE-2019-10063: a filter comparing 64 bits
// misses it, the kernel truncates it to 32).
func tiocsti(fd int, high bool) error {
	c := byte(' ')
	req := uintptr(unix.TIOCSTI)
	if high {
		req |= 0x123 << 32
	}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(unsafe.Pointer(&c)))
	return errnoOf(e)
}

// schedSetscheduler sets this thread's policy and priority.
func schedSetscheduler(policy int, prio int32) unix.Errno {
	_, _, e := unix.Syscall(unix.SYS_SCHED_SETSCHEDULER, 0, uintptr(policy), uintptr(unsafe.Pointer(&prio)))
	return e
}
