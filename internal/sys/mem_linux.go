package sys

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Reserve maps size bytes of address space without committing memory;
// pages are committed as they are touched and read as zeros until then.
func Reserve(size uint64) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("reserving %d bytes: %w", size, err)
	}
	return b, nil
}

// Unreserve unmaps a region Reserve returned.
func Unreserve(b []byte) {
	_ = unix.Munmap(b) // only fails for a region Reserve did not return
}

// DropPages returns b's pages to the kernel; they read back as zeros.
func DropPages(b []byte) error {
	return unix.Madvise(b, unix.MADV_DONTNEED)
}

// ResidentBytes returns how many bytes of the file at path are in the page
// cache (cachestat(2), Linux 6.5 and later).
func ResidentBytes(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var st unix.Cachestat_t
	if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &st, 0); err != nil {
		return 0, fmt.Errorf("cachestat %s: %w", path, err)
	}
	return int64(st.Cache) * int64(os.Getpagesize()), nil
}

// DropRange returns the pages of [start, start+length) to the kernel
// (MADV_DONTNEED), for mappings that are not Go memory and so are named
// by address, such as the executable's own. File pages fault back in
// from the page cache; anonymous ones read back as zeros.
func DropRange(start, length uintptr) error {
	if _, _, e := unix.Syscall(unix.SYS_MADVISE, start, length, unix.MADV_DONTNEED); e != 0 {
		return e
	}
	return nil
}
