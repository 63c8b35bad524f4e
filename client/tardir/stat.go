package tardir

import "io/fs"

// stat is what Write records of a file beyond its fs.FileInfo.
type stat struct {
	mode     uint32 // permission bits with setuid, setgid and sticky
	uid, gid int
	nlink    uint64
	dev, ino uint64
	hasID    bool // dev and ino are known
}

// fallbackStat derives what it can from fi alone: owner 0, no hard links.
func fallbackStat(fi fs.FileInfo) stat {
	m := fi.Mode()
	mode := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return stat{mode: mode, nlink: 1}
}
