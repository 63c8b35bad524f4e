package layer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// A minimal reader of EROFS directories (erofs_fs.h), enough to find a
// name's directory entry and re-point it at another inode.

// EROFS inode layouts.
const (
	layoutFlatPlain  = 0
	layoutFlatInline = 2
	direntSize       = 12
	erofsFTDir       = 2
	modeTypeMask     = 0o170000
	modeDir          = 0o040000
)

type erofsImage struct {
	r        io.ReaderAt
	sb       Superblock
	metaBase int64
}

type erofsInode struct {
	nid      uint64
	mode     uint16
	size     uint64
	layout   int
	blkaddr  uint32
	xattrAt  int64 // where the inode's xattr body starts
	xattrLen int64
	inlineAt int64 // where inline data starts (after the inode and its xattrs)
}

func openErofs(r io.ReaderAt) (*erofsImage, error) {
	b := make([]byte, 1<<maxBlockBits)
	n, err := r.ReadAt(b, 0)
	if err != nil && err != io.EOF {
		return nil, err
	}
	sb, err := ParseSuperblock(b[:n])
	if err != nil {
		return nil, err
	}
	return &erofsImage{r: r, sb: sb, metaBase: int64(sb.MetaBlockAddr) << sb.BlockBits}, nil
}

func (img *erofsImage) inode(nid uint64) (erofsInode, error) {
	var b [64]byte
	at := img.metaBase + int64(nid)*32
	if _, err := img.r.ReadAt(b[:32], at); err != nil {
		return erofsInode{}, fmt.Errorf("inode %d: %w", nid, err)
	}
	le := binary.LittleEndian
	format := le.Uint16(b[0:])
	ino := erofsInode{nid: nid, mode: le.Uint16(b[4:]), layout: int(format>>1) & 7, blkaddr: le.Uint32(b[16:])}
	isize := int64(32)
	if format&1 != 0 {
		if _, err := img.r.ReadAt(b[:64], at); err != nil {
			return erofsInode{}, fmt.Errorf("inode %d: %w", nid, err)
		}
		isize = 64
		ino.size = le.Uint64(b[8:])
	} else {
		ino.size = uint64(le.Uint32(b[8:]))
	}
	var xsize int64
	if icount := le.Uint16(b[2:]); icount > 0 {
		xsize = 12 + 4*(int64(icount)-1)
	}
	ino.xattrAt, ino.xattrLen = at+isize, xsize
	ino.inlineAt = at + isize + xsize
	return ino, nil
}

// dataAt returns the image offset of byte pos of a directory's data.
func (img *erofsImage) dataAt(ino erofsInode, pos int64) (int64, error) {
	bs := int64(img.sb.BlockSize())
	switch ino.layout {
	case layoutFlatPlain:
		return int64(ino.blkaddr)*bs + pos, nil
	case layoutFlatInline:
		full := int64(ino.size) / bs * bs
		if pos < full {
			return int64(ino.blkaddr)*bs + pos, nil
		}
		return ino.inlineAt + pos - full, nil
	}
	return 0, fmt.Errorf("inode %d: unsupported directory layout %d", ino.nid, ino.layout)
}

// forEachBlock calls fn with each block of a directory's entries (the
// last may be short) and its image offset; fn may modify the block, and
// then forEachBlock writes it back.
func (img *erofsImage) forEachBlock(dir erofsInode, w io.WriterAt, fn func(b []byte) (modified bool, err error)) error {
	if dir.mode&modeTypeMask != modeDir {
		return fmt.Errorf("inode %d is not a directory", dir.nid)
	}
	bs := int64(img.sb.BlockSize())
	blk := make([]byte, bs)
	for pos := int64(0); pos < int64(dir.size); pos += bs {
		n := min(bs, int64(dir.size)-pos)
		at, err := img.dataAt(dir, pos)
		if err != nil {
			return err
		}
		if _, err := img.r.ReadAt(blk[:n], at); err != nil {
			return fmt.Errorf("directory %d: %w", dir.nid, err)
		}
		modified, err := fn(blk[:n])
		if err != nil {
			return fmt.Errorf("directory %d: %w", dir.nid, err)
		}
		if modified {
			if _, err := w.WriteAt(blk[:n], at); err != nil {
				return err
			}
		}
	}
	return nil
}

// dirent is one directory entry; at is its index in the block.
type dirent struct {
	at    int
	name  string
	nid   uint64
	ftype byte
}

// direntsOf parses one directory block.
func direntsOf(b []byte) ([]dirent, error) {
	if len(b) < direntSize {
		return nil, errors.New("short directory block")
	}
	count := int(binary.LittleEndian.Uint16(b[8:])) / direntSize
	if count == 0 || count*direntSize > len(b) {
		return nil, errors.New("bad directory entry count")
	}
	out := make([]dirent, count)
	for i := range out {
		d := b[i*direntSize:]
		start, end := int(binary.LittleEndian.Uint16(d[8:])), len(b)
		if i+1 < count {
			end = int(binary.LittleEndian.Uint16(d[direntSize+8:]))
		}
		if start > end || end > len(b) {
			return nil, errors.New("bad directory name offsets")
		}
		nm := b[start:end]
		if z := bytes.IndexByte(nm, 0); z >= 0 {
			nm = nm[:z]
		}
		out[i] = dirent{at: i * direntSize, name: string(nm), nid: binary.LittleEndian.Uint64(d[0:]), ftype: d[10]}
	}
	return out, nil
}

// findDirent returns the image offset of the entry called name in dir,
// and the inode number it points at.
func (img *erofsImage) findDirent(dir erofsInode, name string) (off int64, nid uint64, err error) {
	bs := int64(img.sb.BlockSize())
	found := false
	var pos int64
	err = img.forEachBlock(dir, nil, func(b []byte) (bool, error) {
		if !found {
			ds, err := direntsOf(b)
			if err != nil {
				return false, err
			}
			for _, d := range ds {
				if d.name == name {
					at, err := img.dataAt(dir, pos)
					off, nid, found = at+int64(d.at), d.nid, true
					return false, err
				}
			}
		}
		pos += bs
		return false, nil
	})
	if err == nil && !found {
		err = errors.New("no entry " + name)
	}
	return off, nid, err
}

// lookup returns the inode number of a path ("" is the root).
func (img *erofsImage) lookup(p string) (uint64, error) {
	nid := uint64(img.sb.RootNID)
	if p == "" {
		return nid, nil
	}
	for _, c := range strings.Split(p, "/") {
		dir, err := img.inode(nid)
		if err != nil {
			return 0, err
		}
		if _, nid, err = img.findDirent(dir, c); err != nil {
			return 0, fmt.Errorf("looking up %s: %w", p, err)
		}
	}
	return nid, nil
}

type readWriterAt interface {
	io.ReaderAt
	io.WriterAt
}

// patchHardlinks re-points each link's directory entry at its primary's
// inode. The superblock carries no checksum of directories, so nothing
// else changes.
func patchHardlinks(f readWriterAt, links []hardlink) error {
	if len(links) == 0 {
		return nil
	}
	img, err := openErofs(f)
	if err != nil {
		return fmt.Errorf("patching hard links: %w", err)
	}
	for _, l := range links {
		target, err := img.lookup(l.primary)
		if err != nil {
			return fmt.Errorf("patching hard links: %w", err)
		}
		dirPath, name := "", l.path
		if i := strings.LastIndexByte(l.path, '/'); i >= 0 {
			dirPath, name = l.path[:i], l.path[i+1:]
		}
		dirNID, err := img.lookup(dirPath)
		if err != nil {
			return fmt.Errorf("patching hard links: %w", err)
		}
		dir, err := img.inode(dirNID)
		if err != nil {
			return fmt.Errorf("patching hard links: %w", err)
		}
		off, _, err := img.findDirent(dir, name)
		if err != nil {
			return fmt.Errorf("patching hard links: %s: %w", l.path, err)
		}
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], target)
		if _, err := f.WriteAt(b[:], off); err != nil {
			return fmt.Errorf("patching hard links: %w", err)
		}
	}
	return nil
}

// rebaseRoot moves the metadata base (meta_blkaddr) one block back, so
// every inode number grows by blockSize/32 and the root's is no longer 0.
// go-erofs v0.3.1 writes data first and metadata after it, with the root
// as the first inode: nid 0, which the kernel reports as inode number 0.
// Readdir users skip entries with inode 0 (ls hides ".", ".." of the root
// and ".." of its subdirectories) and overlayfs and archivers treat 0 as
// "no inode". The inodes stay where they are; only the base and the
// references (the superblock's root, every directory entry) change.
func rebaseRoot(f readWriterAt) error {
	img, err := openErofs(f)
	if err != nil {
		return err
	}
	if img.sb.MetaBlockAddr == 0 {
		return nil // metadata already starts at block 0 (as with mkfs.erofs)
	}
	shift := uint64(img.sb.BlockSize() / 32)
	if uint64(img.sb.RootNID)+shift > 0xffff {
		return fmt.Errorf("root inode %d cannot move", img.sb.RootNID)
	}
	seen := map[uint64]bool{}
	queue := []uint64{uint64(img.sb.RootNID)}
	for len(queue) > 0 {
		nid := queue[0]
		queue = queue[1:]
		if seen[nid] {
			continue
		}
		seen[nid] = true
		dir, err := img.inode(nid)
		if err != nil {
			return err
		}
		err = img.forEachBlock(dir, f, func(b []byte) (bool, error) {
			ds, err := direntsOf(b)
			if err != nil {
				return false, err
			}
			for _, d := range ds {
				if d.ftype == erofsFTDir && d.name != "." && d.name != ".." {
					queue = append(queue, d.nid)
				}
				binary.LittleEndian.PutUint64(b[d.at:], d.nid+shift)
			}
			return true, nil
		})
		if err != nil {
			return err
		}
	}
	b := make([]byte, img.sb.BlockSize())
	if _, err := f.ReadAt(b, 0); err != nil {
		return err
	}
	le := binary.LittleEndian
	sb := b[erofsSuperOffset:]
	le.PutUint16(sb[14:], uint16(uint64(img.sb.RootNID)+shift))
	le.PutUint32(sb[40:], img.sb.MetaBlockAddr-1)
	if le.Uint32(sb[8:])&compatSBChecksum != 0 {
		le.PutUint32(sb[4:], superblockChecksum(b))
	}
	_, err = f.WriteAt(b[erofsSuperOffset:erofsSuperOffset+erofsSuperSize], erofsSuperOffset)
	return err
}

// fixDeviceTable corrects the device table offset go-erofs v0.3.1 writes:
// it puts the slot right after the superblock (byte 1152, slot 9) but
// records slot 8, which is the superblock itself. The kernel then reads
// the slot's block count and mapped address from the superblock's volume
// name (zeros), which happens to work; fsck.erofs and this package's
// validation want the real slot.
func fixDeviceTable(f readWriterAt) error {
	b := make([]byte, blockSize)
	if _, err := f.ReadAt(b, 0); err != nil {
		return fmt.Errorf("reading the superblock: %w", err)
	}
	sb := b[erofsSuperOffset:]
	le := binary.LittleEndian
	want := uint16((erofsSuperOffset + erofsSuperSize) / erofsDevSlotSize)
	if le.Uint32(sb) != erofsMagic || le.Uint16(sb[86:]) == 0 || le.Uint16(sb[88:]) >= want {
		return nil
	}
	le.PutUint16(sb[88:], want)
	if le.Uint32(sb[8:])&compatSBChecksum != 0 {
		le.PutUint32(sb[4:], superblockChecksum(b))
	}
	_, err := f.WriteAt(b[erofsSuperOffset:erofsSuperOffset+erofsSuperSize], erofsSuperOffset)
	return err
}
