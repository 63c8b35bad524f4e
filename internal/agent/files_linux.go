package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/agentproto"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// The files API is the function tier's (internal/function/files.go) with
// the sandbox's whole root as the file root: the same checks, error codes
// and atomic writes, through an os.Root so that no path, symlink or not,
// leads out of Options.Root.

// maxListDepth caps List.
const maxListDepth = 32

// fileRoot is the root the node sees.
const fileRoot = "/"

// resolve cleans a node path (a relative one is relative to
// sandbox.Workdir, where commands start) and returns it and its path in
// the root.
func resolve(p string) (abs, rel string, err error) {
	abs, err = sandbox.CleanPath(fileRoot, p)
	if err != nil {
		return "", "", err
	}
	return abs, sandbox.RelPath(fileRoot, abs), nil
}

// isNotExist reports whether err means a missing file, including a path
// through a file where a directory was expected.
func isNotExist(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// fileError classifies an error of an operation on the file at abs.
func fileError(abs string, err error) error { return sandbox.FileError(abs, err) }

func (a *agent) statPath(abs, rel string) (api.FileInfo, error) {
	info, err := sandbox.Lstat(a.root, abs, rel)
	return info, fileError(abs, err)
}

// open streams a regular file: its FileInfo as an event, then its
// content.
func (a *agent) open(c *agentproto.Call, args agentproto.PathArgs) {
	abs, rel, err := resolve(args.Path)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	fh, fi, err := sandbox.OpenRegular(a.root, abs, rel)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	defer fh.Close()
	if err := c.Event(sandbox.FileInfo(abs, fi)); err != nil {
		c.Reply(nil, err)
		return
	}
	// The size at open bounds the download: a file that grows meanwhile
	// (a log being written) is cut there, as the node announces.
	r := io.LimitReader(fh, fi.Size())
	for {
		if err := c.Context().Err(); err != nil {
			c.Reply(nil, fileError(abs, err))
			return
		}
		buf := make([]byte, agentproto.ChunkSize)
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if err := c.Send(agentproto.ChanOut, buf[:n]); err != nil {
				c.Reply(nil, err)
				return
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			c.Reply(struct{}{}, nil)
			return
		}
		if err != nil {
			c.Reply(nil, fileError(abs, err))
			return
		}
	}
}

// write replaces a file with the call's data: a temporary file in the
// target's directory, renamed over the target once complete.
func (a *agent) write(c *agentproto.Call, args agentproto.WriteArgs) {
	fi, err := a.writeFile(c, args)
	c.Reply(fi, err)
}

func (a *agent) writeFile(c *agentproto.Call, args agentproto.WriteArgs) (api.FileInfo, error) {
	abs, rel, err := resolve(args.Path)
	if err != nil {
		return api.FileInfo{}, err
	}
	if rel == "." {
		return api.FileInfo{}, errdefs.New(errdefs.Invalid, sandbox.CodeIsADirectory, "%s is a directory", abs)
	}
	dir := path.Dir(rel)
	if args.Parents && dir != "." {
		if err := a.root.MkdirAll(dir, 0o755); err != nil {
			return api.FileInfo{}, fileError(path.Dir(abs), err)
		}
	}
	if fi, err := a.root.Lstat(rel); err == nil && fi.IsDir() {
		return api.FileInfo{}, errdefs.New(errdefs.Invalid, sandbox.CodeIsADirectory, "%s is a directory", abs)
	}
	mode := fs.FileMode(args.Mode).Perm()
	if args.Mode == 0 {
		mode = 0o644
	}
	// The name need not be secret (O_EXCL refuses a planted file), so
	// math/rand spares the binary the crypto packages.
	var suffix [8]byte
	binary.LittleEndian.PutUint64(suffix[:], rand.Uint64())
	tmp := path.Join(dir, ".dsec-write-"+hex.EncodeToString(suffix[:]))
	fh, err := a.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if isNotExist(err) {
		return api.FileInfo{}, errdefs.New(errdefs.NotFound, sandbox.CodeParentNotFound,
			"directory %s does not exist (write with parents to create it)", path.Dir(abs))
	}
	if err != nil {
		return api.FileInfo{}, fileError(abs, err)
	}
	done := false
	defer func() {
		if !done {
			fh.Close()
			a.root.Remove(tmp)
		}
	}()
	var n int64
	for {
		b, err := c.Recv(c.Context())
		if err == io.EOF {
			break
		}
		if err != nil {
			return api.FileInfo{}, fileError(abs, err)
		}
		n += int64(len(b))
		if args.MaxBytes > 0 && n > args.MaxBytes {
			return api.FileInfo{}, errdefs.New(errdefs.TooLarge, sandbox.CodeFileTooLarge, "%s would be larger than %d bytes", abs, args.MaxBytes)
		}
		if _, err := fh.Write(b); err != nil {
			return api.FileInfo{}, fileError(abs, err)
		}
	}
	if err := fh.Chmod(mode); err != nil {
		return api.FileInfo{}, fileError(abs, err)
	}
	if err := fh.Close(); err != nil {
		return api.FileInfo{}, fileError(abs, err)
	}
	if err := a.root.Rename(tmp, rel); err != nil {
		return api.FileInfo{}, fileError(abs, err)
	}
	done = true
	return a.statPath(abs, rel)
}

// list streams a directory listing, sorted by path, as NDJSON.
func (a *agent) list(c *agentproto.Call, args agentproto.ListArgs) {
	abs, rel, err := resolve(args.Path)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	depth := min(max(args.Depth, 1), maxListDepth)
	fi, err := a.root.Lstat(rel)
	if err != nil {
		c.Reply(nil, fileError(abs, err))
		return
	}
	if !fi.IsDir() {
		c.Reply(nil, errdefs.New(errdefs.Invalid, sandbox.CodeNotADirectory, "%s is not a directory", abs))
		return
	}
	var out []api.FileInfo
	if err := a.walk(c.Context(), abs, rel, depth, &out); err != nil {
		c.Reply(nil, err)
		return
	}
	slices.SortFunc(out, func(x, y api.FileInfo) int { return strings.Compare(x.Path, y.Path) })
	if err := sendLines(c, out); err != nil {
		c.Reply(nil, err)
		return
	}
	c.Reply(struct{}{}, nil)
}

func (a *agent) walk(ctx context.Context, abs, rel string, depth int, out *[]api.FileInfo) error {
	if err := ctx.Err(); err != nil {
		return fileError(abs, err)
	}
	dir, err := a.root.Open(rel)
	if err != nil {
		return fileError(abs, err)
	}
	entries, err := dir.ReadDir(-1)
	dir.Close()
	if err != nil {
		return fileError(abs, err)
	}
	for _, e := range entries {
		childAbs, childRel := path.Join(abs, e.Name()), path.Join(rel, e.Name())
		info, err := a.statPath(childAbs, childRel)
		if errdefs.ClassOf(err) == errdefs.NotFound {
			continue // removed while we list
		}
		if err != nil {
			return err
		}
		if len(*out) >= sandbox.MaxListEntries {
			return errdefs.New(errdefs.TooLarge, sandbox.CodeTooManyEntries, "the listing has more than %d entries; list less deep", sandbox.MaxListEntries)
		}
		*out = append(*out, info)
		if info.Type == api.FileTypeDir && depth > 1 {
			if err := a.walk(ctx, childAbs, childRel, depth-1, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// sendLines sends entries as NDJSON on ChanOut, in chunks.
func sendLines[T any](c *agentproto.Call, entries []T) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	flush := func() error {
		if buf.Len() == 0 {
			return nil
		}
		b := bytes.Clone(buf.Bytes())
		buf.Reset()
		return c.Send(agentproto.ChanOut, b)
	}
	for _, e := range entries {
		if err := enc.Encode(e); err != nil {
			return err
		}
		if buf.Len() >= agentproto.ChunkSize {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

func (a *agent) stat(c *agentproto.Call, args agentproto.PathArgs) {
	abs, rel, err := resolve(args.Path)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	c.Reply(a.statPath(abs, rel))
}

func (a *agent) mkdir(c *agentproto.Call, args agentproto.MkdirArgs) {
	abs, rel, err := resolve(args.Path)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	if args.Parents {
		err = a.root.MkdirAll(rel, 0o755)
	} else {
		err = a.root.Mkdir(rel, 0o755)
	}
	if err != nil {
		c.Reply(nil, fileError(abs, err))
		return
	}
	c.Reply(a.statPath(abs, rel))
}

func (a *agent) remove(c *agentproto.Call, args agentproto.RemoveArgs) {
	abs, rel, err := resolve(args.Path)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	if rel == "." {
		c.Reply(nil, errdefs.New(errdefs.Invalid, sandbox.CodePathIsRoot, "%s cannot be removed", fileRoot))
		return
	}
	if _, err := a.root.Lstat(rel); err != nil {
		c.Reply(nil, fileError(abs, err))
		return
	}
	if args.Recursive {
		err = a.root.RemoveAll(rel)
	} else {
		err = a.root.Remove(rel)
		if errors.Is(err, syscall.EEXIST) {
			err = &fs.PathError{Op: "remove", Path: rel, Err: syscall.ENOTEMPTY}
		}
	}
	if err != nil {
		c.Reply(nil, fileError(abs, err))
		return
	}
	c.Reply(struct{}{}, nil)
}

func (a *agent) rename(c *agentproto.Call, args agentproto.RenameArgs) {
	fromAbs, fromRel, err := resolve(args.From)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	toAbs, toRel, err := resolve(args.To)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	if fromRel == "." || toRel == "." {
		c.Reply(nil, errdefs.New(errdefs.Invalid, sandbox.CodePathIsRoot, "%s cannot be renamed or replaced", fileRoot))
		return
	}
	if _, err := a.root.Lstat(fromRel); err != nil {
		c.Reply(nil, fileError(fromAbs, err))
		return
	}
	if err := a.root.Rename(fromRel, toRel); err != nil {
		c.Reply(nil, fileError(toAbs, err))
		return
	}
	c.Reply(a.statPath(toAbs, toRel))
}
