package layer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
)

// normalizeXattrs sorts every inode's inline xattr entries (by prefix
// index, then name) and shared xattr references. mkfs.erofs 1.5 writes
// them in the order the source file system lists them, which depends on
// the order they were set and on the file system type; sorted, the image
// depends only on the xattrs themselves, as TreeDigest does. Entries keep
// their sizes, so only bytes inside each xattr body move.
func normalizeXattrs(f readWriterAt) error {
	img, err := openErofs(f)
	if err != nil {
		return err
	}
	changed := false
	seen := map[uint64]bool{}
	queue := []uint64{uint64(img.sb.RootNID)}
	for len(queue) > 0 {
		nid := queue[0]
		queue = queue[1:]
		if seen[nid] {
			continue
		}
		seen[nid] = true
		ino, err := img.inode(nid)
		if err != nil {
			return err
		}
		if ino.xattrLen > 0 {
			c, err := sortXattrBody(f, ino)
			if err != nil {
				return fmt.Errorf("inode %d: %w", nid, err)
			}
			changed = changed || c
		}
		if ino.mode&modeTypeMask != modeDir {
			continue
		}
		err = img.forEachBlock(ino, nil, func(b []byte) (bool, error) {
			ds, err := direntsOf(b)
			for _, d := range ds {
				if d.name != "." && d.name != ".." {
					queue = append(queue, d.nid)
				}
			}
			return false, err
		})
		if err != nil {
			return err
		}
	}
	if !changed {
		return nil
	}
	return rewriteChecksum(f, img.sb)
}

// sortXattrBody sorts one xattr body in place.
func sortXattrBody(f readWriterAt, ino erofsInode) (bool, error) {
	b := make([]byte, ino.xattrLen)
	if _, err := f.ReadAt(b, ino.xattrAt); err != nil {
		return false, err
	}
	if len(b) < 12 {
		return false, errors.New("short xattr body")
	}
	shared := int(b[4])
	pos := 12 + 4*shared
	if pos > len(b) {
		return false, errors.New("bad shared xattr count")
	}
	ids := make([]uint32, shared)
	for i := range ids {
		ids[i] = binary.LittleEndian.Uint32(b[12+4*i:])
	}
	var ents [][]byte
	for pos < len(b) {
		if pos+4 > len(b) {
			return false, errors.New("truncated xattr entry")
		}
		n := 4 + int(b[pos]) + int(binary.LittleEndian.Uint16(b[pos+2:]))
		n = (n + 3) &^ 3
		if pos+n > len(b) {
			return false, errors.New("xattr entry overruns its body")
		}
		ents = append(ents, b[pos:pos+n])
		pos += n
	}
	key := func(e []byte) []byte { return append([]byte{e[1]}, e[4:4+int(e[0])]...) }
	if slices.IsSorted(ids) && sort.SliceIsSorted(ents, func(i, j int) bool { return bytes.Compare(key(ents[i]), key(ents[j])) < 0 }) {
		return false, nil
	}
	slices.Sort(ids)
	sort.SliceStable(ents, func(i, j int) bool { return bytes.Compare(key(ents[i]), key(ents[j])) < 0 })
	out := append([]byte(nil), b[:12]...)
	for _, id := range ids {
		out = binary.LittleEndian.AppendUint32(out, id)
	}
	for _, e := range ents {
		out = append(out, e...)
	}
	_, err := f.WriteAt(out, ino.xattrAt)
	return true, err
}

// rewriteChecksum recomputes the superblock checksum, if the image has
// one, after block 0 may have changed.
func rewriteChecksum(f readWriterAt, sb Superblock) error {
	if sb.FeatureCompat&compatSBChecksum == 0 {
		return nil
	}
	b := make([]byte, sb.BlockSize())
	if _, err := f.ReadAt(b, 0); err != nil {
		return err
	}
	binary.LittleEndian.PutUint32(b[erofsSuperOffset+4:], superblockChecksum(b))
	_, err := f.WriteAt(b[erofsSuperOffset:erofsSuperOffset+erofsSuperSize], erofsSuperOffset)
	return err
}
