//go:build unix

package function

import (
	"errors"
	"io/fs"
	"syscall"
)

func inode(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino)
	}
	return 0
}

func isNotDir(err error) bool { return errors.Is(err, syscall.ENOTDIR) }
