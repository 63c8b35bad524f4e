package layer

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/erofs/go-erofs"
)

// writeMeta writes meta.erofs for the tree with go-erofs: file data is
// already in blob (device 1), so the metadata is copied in go-erofs'
// metadata-only mode, each file pointing at its range of the blob.
//
// go-erofs has no hard links. Each extra name of a multiply linked file is
// written as an empty placeholder inode, and its directory entry is then
// patched to the first name's inode (patchHardlinks); the placeholders
// stay unreferenced.
func (t *tree) writeMeta(meta, blob *os.File) error {
	links := t.prepare()
	w := erofs.Create(meta, erofs.WithDataFile(blob), erofs.WithBuildTime(0, 0))
	if err := w.CopyFrom(treeFS{t}, erofs.MetadataOnly()); err != nil {
		return fmt.Errorf("writing %s: %w", MetaFile, err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", MetaFile, err)
	}
	if err := fixDeviceTable(meta); err != nil {
		return fmt.Errorf("writing %s: %w", MetaFile, err)
	}
	if err := rebaseRoot(meta); err != nil {
		return fmt.Errorf("writing %s: %w", MetaFile, err)
	}
	return patchHardlinks(meta, links)
}

// hardlink is a name to re-point at its primary's inode.
type hardlink struct{ path, primary string }

// prepare counts links and picks, for each inode with several names, its
// primary name (the first in walk order). It returns the other names.
func (t *tree) prepare() []hardlink {
	primary := map[*inode]string{}
	var links []hardlink
	t.walk(func(n *node) {
		switch n.ino.kind {
		case kindDir:
			n.ino.nlink = 2
			for _, c := range n.children {
				if c.ino.kind == kindDir {
					n.ino.nlink++
				}
			}
		case kindFile:
			p := n.path()
			if first, ok := primary[n.ino]; ok {
				links = append(links, hardlink{p, first})
				n.placeholder = true
				n.ino.nlink++
			} else {
				primary[n.ino] = p
				n.ino.nlink = 1
			}
		default:
			n.ino.nlink = 1
		}
	})
	return links
}

// treeFS shows the tree as an fs.FS for erofs.Writer.CopyFrom: Sys()
// returns *erofs.Stat (owner, xattrs, link count, mtime: 0 but in state
// layers) and regular files report their blob range through DataRange.
type treeFS struct{ t *tree }

func (f treeFS) lookup(name string) (*node, error) {
	if !fs.ValidPath(name) {
		return nil, fs.ErrInvalid
	}
	n := f.t.root
	if name == "." {
		return n, nil
	}
	for _, c := range strings.Split(name, "/") {
		if n.children == nil {
			return nil, fs.ErrNotExist
		}
		if n = n.children[c]; n == nil {
			return nil, fs.ErrNotExist
		}
	}
	return n, nil
}

func (f treeFS) info(n *node) *nodeInfo {
	return &nodeInfo{n: n, placeholder: n.placeholder}
}

func (f treeFS) Open(name string) (fs.File, error) {
	n, err := f.lookup(name)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	return &nodeFile{fs: f, n: n}, nil
}

func (f treeFS) Stat(name string) (fs.FileInfo, error) {
	n, err := f.lookup(name)
	if err != nil {
		return nil, &fs.PathError{Op: "stat", Path: name, Err: err}
	}
	return f.info(n), nil
}

func (f treeFS) ReadDir(name string) ([]fs.DirEntry, error) {
	n, err := f.lookup(name)
	if err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: err}
	}
	if n.children == nil {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: errors.New("not a directory")}
	}
	names := sortedNames(n)
	out := make([]fs.DirEntry, len(names))
	for i, c := range names {
		out[i] = fs.FileInfoToDirEntry(f.info(n.children[c]))
	}
	return out, nil
}

// ReadLink is how CopyFrom learns symlink targets.
func (f treeFS) ReadLink(name string) (string, error) {
	n, err := f.lookup(name)
	if err != nil {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: err}
	}
	return n.ino.target, nil
}

type nodeFile struct {
	fs  treeFS
	n   *node
	off int
}

func (f *nodeFile) Stat() (fs.FileInfo, error) { return f.fs.info(f.n), nil }
func (f *nodeFile) Read([]byte) (int, error) {
	return 0, errors.New("tree files have no readable data: it is in the blob")
}
func (f *nodeFile) Close() error { return nil }

func (f *nodeFile) ReadDir(count int) ([]fs.DirEntry, error) {
	name := "."
	if f.n.parent != nil {
		name = f.n.path()
	}
	all, err := f.fs.ReadDir(name)
	if err != nil {
		return nil, err
	}
	rest := all[f.off:]
	if count > 0 && len(rest) > count {
		rest = rest[:count]
	}
	f.off += len(rest)
	if count > 0 && len(rest) == 0 {
		return nil, io.EOF
	}
	return rest, nil
}

type nodeInfo struct {
	n           *node
	placeholder bool // an extra hard link name, patched after the build
}

func (i *nodeInfo) Name() string {
	if i.n.parent == nil {
		return "."
	}
	return i.n.name
}

func (i *nodeInfo) Size() int64 {
	switch {
	case i.placeholder:
		return 0
	case i.n.ino.kind == kindFile:
		return i.n.ino.size
	case i.n.ino.kind == kindSymlink:
		return int64(len(i.n.ino.target))
	}
	return 0
}

func (i *nodeInfo) Mode() fs.FileMode {
	m := fs.FileMode(i.n.ino.mode & 0o777)
	if i.n.ino.mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if i.n.ino.mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if i.n.ino.mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	switch i.n.ino.kind {
	case kindDir:
		m |= fs.ModeDir
	case kindSymlink:
		m |= fs.ModeSymlink
	case kindWhiteout:
		m |= fs.ModeDevice | fs.ModeCharDevice // 0/0
	}
	return m
}

func (i *nodeInfo) ModTime() time.Time {
	return time.Unix(int64(i.n.ino.mtime), int64(i.n.ino.mtimeNs))
}
func (i *nodeInfo) IsDir() bool { return i.n.ino.kind == kindDir }

func (i *nodeInfo) Sys() any {
	nlink := i.n.ino.nlink
	if i.placeholder {
		nlink = 1
	}
	return &erofs.Stat{
		UID:     i.n.ino.uid,
		GID:     i.n.ino.gid,
		Nlink:   int(nlink),
		Xattrs:  i.n.ino.xattrs,
		Mtime:   i.n.ino.mtime,
		MtimeNs: i.n.ino.mtimeNs,
	}
}

// DataRange locates a regular file's data in the blob (go-erofs device 0
// of this source is the image's extra device 1).
func (i *nodeInfo) DataRange() []erofs.DataRange {
	if i.placeholder || i.n.ino.kind != kindFile || i.n.ino.size == 0 {
		return nil
	}
	return []erofs.DataRange{{Device: 0, Offset: i.n.ino.off, Size: i.n.ino.size}}
}
