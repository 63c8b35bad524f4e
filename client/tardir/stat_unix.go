//go:build unix

package tardir

import (
	"io/fs"
	"syscall"
)

func statOf(fi fs.FileInfo) stat {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fallbackStat(fi)
	}
	return stat{
		mode:  uint32(st.Mode) & 0o7777,
		uid:   int(st.Uid),
		gid:   int(st.Gid),
		nlink: uint64(st.Nlink),
		dev:   uint64(st.Dev),
		ino:   uint64(st.Ino),
		hasID: true,
	}
}
