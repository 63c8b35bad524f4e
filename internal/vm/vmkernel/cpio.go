package vmkernel

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"path"
	"slices"
	"strings"
)

// cpioEntry is one file of an initramfs.
type cpioEntry struct {
	Name  string // relative, no leading slash ("lib/modules/x.ko")
	Mode  uint32 // type and permission bits (cpioDir|0o755)
	Data  []byte // regular files only
	Major uint32 // device nodes only
	Minor uint32
}

// File type bits of a newc header's mode.
const (
	cpioDir  = 0o040000
	cpioReg  = 0o100000
	cpioChar = 0o020000
)

// cpioGzip writes entries as a gzip-compressed newc cpio archive
// (cpioArchive's bytes, with a zeroed gzip header).
func cpioGzip(entries []cpioEntry) ([]byte, error) {
	raw, err := cpioArchive(entries)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	zw, err := gzip.NewWriterLevel(&out, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(raw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// cpioArchive writes entries as an uncompressed newc ("070701") cpio
// archive, the format the kernel unpacks as initramfs. The output depends
// only on the entries: they are sorted by name (missing parent
// directories added, 0755), inode numbers count up from 1, and owners
// and times are zero. Every file is owned by root.
func cpioArchive(entries []cpioEntry) ([]byte, error) {
	all := map[string]cpioEntry{}
	for _, e := range entries {
		name := path.Clean(strings.TrimPrefix(e.Name, "/"))
		if name == "." || strings.HasPrefix(name, "../") || name == ".." {
			return nil, fmt.Errorf("bad initramfs path %q", e.Name)
		}
		if _, dup := all[name]; dup {
			return nil, fmt.Errorf("initramfs path %q twice", name)
		}
		e.Name = name
		all[name] = e
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if _, ok := all[d]; !ok {
				all[d] = cpioEntry{Name: d, Mode: cpioDir | 0o755}
			}
		}
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	slices.Sort(names)

	var raw bytes.Buffer
	for i, n := range names {
		e := all[n]
		if e.Mode&cpioDir == 0 && e.Mode&0o170000 == 0 {
			e.Mode |= cpioReg
		}
		if e.Mode&0o170000 != cpioReg && len(e.Data) > 0 {
			return nil, fmt.Errorf("initramfs entry %q has data but is not a file", n)
		}
		nlink := 1
		if e.Mode&0o170000 == cpioDir {
			nlink = 2
		}
		writeCpioHeader(&raw, uint32(i+1), e.Mode, uint32(nlink), uint32(len(e.Data)), e.Major, e.Minor, n)
		raw.Write(e.Data)
		pad4(&raw)
	}
	writeCpioHeader(&raw, 0, 0, 1, 0, 0, 0, "TRAILER!!!")
	return raw.Bytes(), nil
}

func writeCpioHeader(w *bytes.Buffer, ino, mode, nlink, size, rmajor, rminor uint32, name string) {
	// magic ino mode uid gid nlink mtime filesize devmajor devminor
	// rdevmajor rdevminor namesize check
	fmt.Fprintf(w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, size, 0, 0, rmajor, rminor, len(name)+1, 0)
	w.WriteString(name)
	w.WriteByte(0)
	pad4(w)
}

// pad4 pads w to a multiple of 4 bytes, as newc aligns both the name
// (after the 110-byte header) and the data.
func pad4(w *bytes.Buffer) {
	for w.Len()%4 != 0 {
		w.WriteByte(0)
	}
}
