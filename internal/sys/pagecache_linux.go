package sys

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

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

// IsNoSpace reports whether err is a full disk or an exhausted quota
// (ENOSPC, EDQUOT).
func IsNoSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}
