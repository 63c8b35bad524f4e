package function

import "github.com/dsec-dev/dsec/internal/sys"

// reserve maps size bytes of address space without committing memory;
// pages are committed as they are touched.
func reserve(size uint64) ([]byte, error) { return sys.Reserve(size) }

// unreserve unmaps a region from reserve.
func unreserve(b []byte) { sys.Unreserve(b) }

// release returns the pages of b to the kernel; they read back as zeros.
func release(b []byte) error { return sys.DropPages(b) }
