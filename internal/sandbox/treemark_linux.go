package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"os"
	"slices"
	"strings"
	"syscall"
)

func treeMark(ctx context.Context, root *os.Root) ([sha256.Size]byte, int, error) {
	w := markWalker{h: sha256.New()}
	// The top directory's own metadata (a chmod of the sandbox's /).
	err := w.stat(root, ".")
	if err == nil {
		err = w.dir(ctx, root, 0)
	}
	var sum [sha256.Size]byte
	copy(sum[:], w.h.Sum(nil))
	return sum, w.n, err
}

// maxMarkDepth bounds the walk's recursion (tmpfs has no such limit,
// PATH_MAX aside, and a sandbox could nest directories deeply).
const maxMarkDepth = 2048

type markWalker struct {
	h   hash.Hash
	buf [8 * 12]byte
	n   int
}

func (w *markWalker) dir(ctx context.Context, d *os.Root, depth int) error {
	if depth > maxMarkDepth {
		return fmt.Errorf("marking the writable state: directories nest deeper than %d", maxMarkDepth)
	}
	f, err := d.Open(".")
	if err != nil {
		return fmt.Errorf("marking the writable state: %w", err)
	}
	// Readdir stats each entry relative to the directory's descriptor
	// (fstatat): no path walk per entry. Entries that vanish meanwhile
	// are left out, as if gone before.
	infos, err := f.Readdir(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("marking the writable state: %w", err)
	}
	slices.SortFunc(infos, func(a, b fs.FileInfo) int { return strings.Compare(a.Name(), b.Name()) })
	w.u64(uint64(len(infos)))
	for _, fi := range infos {
		if w.n++; w.n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		name := fi.Name()
		w.h.Write([]byte(name))
		w.h.Write([]byte{0})
		if err := w.info(fi); err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := d.Readlink(name)
			if err == nil {
				w.h.Write([]byte(t))
			}
		case fi.IsDir():
			sub, err := d.OpenRoot(name)
			if errors.Is(err, fs.ErrNotExist) {
				w.h.Write([]byte("gone"))
				continue
			}
			if err != nil {
				return fmt.Errorf("marking the writable state: %w", err)
			}
			err = w.dir(ctx, sub, depth+1)
			sub.Close()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func (w *markWalker) stat(d *os.Root, name string) error {
	fi, err := d.Lstat(name)
	if err != nil {
		return fmt.Errorf("marking the writable state: %w", err)
	}
	return w.info(fi)
}

// info digests an entry's metadata.
func (w *markWalker) info(fi fs.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("marking the writable state: no stat data for %s", fi.Name())
	}
	b := w.buf[:0]
	for _, v := range []uint64{uint64(st.Mode), uint64(st.Uid), uint64(st.Gid), uint64(st.Size), st.Rdev, st.Nlink,
		uint64(st.Mtim.Sec), uint64(st.Mtim.Nsec), uint64(st.Ctim.Sec), uint64(st.Ctim.Nsec), st.Ino} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	w.h.Write(b)
	return nil
}

func (w *markWalker) u64(v uint64) {
	w.h.Write(binary.LittleEndian.AppendUint64(w.buf[:0], v))
}
