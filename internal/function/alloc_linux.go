package function

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// reserve maps size bytes of address space without committing memory;
// pages are committed as they are touched.
func reserve(size uint64) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("reserving %d bytes: %w", size, err)
	}
	return b, nil
}

// unreserve unmaps a region from reserve.
func unreserve(b []byte) {
	_ = unix.Munmap(b) // only fails for a region reserve did not return
}

// release returns the pages of b to the kernel; they read back as zeros.
func release(b []byte) error {
	return unix.Madvise(b, unix.MADV_DONTNEED)
}
