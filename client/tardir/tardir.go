// Package tardir writes a directory tree as a deterministic tar stream, the
// form DSec layer uploads take (client.ImportLayer with client.KindTar).
// The same tree always gives the same bytes, wherever it lives: entries
// come in sorted order, times are zero, owners are numeric, and only what
// a layer keeps is recorded.
package tardir

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/sys"
)

// ErrUnsupportedFile is wrapped by the error of Write for a device node,
// FIFO or socket, which layers do not carry.
var ErrUnsupportedFile = errors.New("device nodes, FIFOs and sockets cannot go into a layer")

// xattrPrefix is the PAX record prefix of extended attributes, as GNU tar
// and star write them.
const xattrPrefix = "SCHILY.xattr."

// epoch is the modification time of every entry; layers fix times anyway.
var epoch = time.Unix(0, 0)

// Write writes the tree under dir to w as a tar stream and ends it. It
// holds, in lexical order of their paths:
//
//   - directories (name ending in "/"), regular files and symlinks, each
//     under its path relative to dir, '/'-separated, without "./";
//   - hard links for the second and later paths of a file with several
//     (pointing at the first path);
//   - for each, its permission bits with setuid, setgid and sticky, its
//     numeric uid and gid (no user or group names), modification time 0
//     and no access or change time, and its extended attributes as PAX
//     records SCHILY.xattr.<name>.
//
// dir itself is not an entry (its mode, owner and xattrs are not
// recorded): a layer's root takes the server's defaults, not, say, the
// 0700 of a temporary directory. If dir is a symlink, the directory it
// points at is written; symlinks inside are written as links. A device
// node, FIFO or socket makes Write fail with an error wrapping
// ErrUnsupportedFile, as does any read error; w then holds a partial
// stream.
func Write(dir string, w io.Writer) error {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	fi, err := os.Stat(root)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	tw := tar.NewWriter(w)
	wr := writer{tw: tw, root: root, links: map[fileID]string{}, buf: make([]byte, 256<<10)}
	// WalkDir visits entries in lexical order (os.ReadDir sorts), so the
	// stream depends on the tree only.
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == root {
			return nil
		}
		return wr.add(path)
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// Open returns a reader of the tar stream Write makes of dir, written by a
// goroutine as it is read. Reading returns Write's error, if any, after
// the bytes written before it. Close stops the writer and waits for it;
// the caller must close the reader.
func Open(dir string) io.ReadCloser {
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		pw.CloseWithError(Write(dir, pw)) // nil closes with io.EOF
	}()
	return &pipeReader{pr: pr, done: done}
}

type pipeReader struct {
	pr   *io.PipeReader
	done chan struct{}
}

func (r *pipeReader) Read(p []byte) (int, error) { return r.pr.Read(p) }

// Close ends the stream: the writer's next write fails and it returns.
func (r *pipeReader) Close() error {
	err := r.pr.CloseWithError(context.Canceled)
	<-r.done
	return err
}

// fileID identifies a file (its inode) for hard link detection.
type fileID struct{ dev, ino uint64 }

// writer is the state of one Write. Not safe for concurrent use.
type writer struct {
	tw    *tar.Writer
	root  string
	links map[fileID]string // first tar name of each multiply linked file
	buf   []byte
}

// add writes the entry of path, a file under w.root.
func (w *writer) add(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(w.root, path)
	if err != nil {
		return err
	}
	name := filepath.ToSlash(rel)
	st := statOf(fi)
	hdr := &tar.Header{
		Name:    name,
		Mode:    int64(st.mode),
		Uid:     st.uid,
		Gid:     st.gid,
		ModTime: epoch,
	}
	mode := fi.Mode()
	switch {
	case mode.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
	case mode.IsRegular():
		hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
	case mode&fs.ModeSymlink != 0:
		target, err := os.Readlink(path)
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
	default:
		return fmt.Errorf("%s (%s): %w", path, typeName(mode), ErrUnsupportedFile)
	}
	if !mode.IsDir() && st.nlink > 1 && st.hasID {
		id := fileID{st.dev, st.ino}
		if first, ok := w.links[id]; ok {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
		} else {
			w.links[id] = name
		}
	}
	xattrs, err := sys.ListXattrs(path)
	if err != nil {
		return err
	}
	for _, x := range xattrs {
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = make(map[string]string, len(xattrs))
		}
		hdr.PAXRecords[xattrPrefix+x.Name] = string(x.Value)
	}
	if err := w.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if hdr.Typeflag != tar.TypeReg {
		return nil
	}
	return w.copyFile(path, hdr.Size)
}

// copyFile writes the size bytes of the regular file path; a file that
// changed size meanwhile is an error, not a corrupt stream.
func (w *writer) copyFile(path string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.CopyBuffer(w.tw, io.LimitReader(f, size), w.buf)
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if n != size {
		return fmt.Errorf("%s shrank from %d to %d bytes while being read", path, size, n)
	}
	return nil
}

func typeName(m fs.FileMode) string {
	switch {
	case m&fs.ModeDevice != 0 && m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSocket != 0:
		return "socket"
	}
	return strings.TrimSpace(m.Type().String())
}
