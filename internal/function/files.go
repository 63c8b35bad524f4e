package function

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"syscall"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// maxListDepth caps Files.List.
const maxListDepth = 32

// files is a sandbox's files API: /workspace, reached only through an
// os.Root on the workspace directory so that no path, symlink or not,
// leads out of it.
type files Sandbox

var _ sandbox.Files = (*files)(nil)

// resolve cleans a user path and returns it and its path in the root.
func resolve(p string) (abs, rel string, err error) {
	abs, err = sandbox.CleanPath(FileRoot, p)
	if err != nil {
		return "", "", err
	}
	return abs, sandbox.RelPath(FileRoot, abs), nil
}

// fileError classifies an error of an operation on the file at abs
// (sandbox.FileError: the one map of every tier's files API, which also
// reports the sandbox's end, os.ErrClosed, as sandbox_not_found).
func fileError(abs string, err error) error { return sandbox.FileError(abs, err) }

func (f *files) stat(abs, rel string) (api.FileInfo, error) {
	info, err := sandbox.Lstat(f.work, abs, rel)
	return info, fileError(abs, err)
}

// Open implements sandbox.Files.
func (f *files) Open(ctx context.Context, p string) (io.ReadCloser, api.FileInfo, error) {
	abs, rel, err := resolve(p)
	if err != nil {
		return nil, api.FileInfo{}, err
	}
	if err := (*Sandbox)(f).enter(); err != nil {
		return nil, api.FileInfo{}, err
	}
	defer f.ops.leave()
	fh, fi, err := sandbox.OpenRegular(f.work, abs, rel)
	if err != nil {
		return nil, api.FileInfo{}, err
	}
	// The size at open bounds the download (a file growing meanwhile is
	// cut there), and the request's and the sandbox's ends stop it.
	r := ctxReader{ctx: ctx, life: f.life, r: io.LimitReader(fh, fi.Size())}
	return readCloser{Reader: r, Closer: fh}, sandbox.FileInfo(abs, fi), nil
}

// Write implements sandbox.Files: the content goes to a temporary file in
// the target's directory, which is then renamed over the target.
func (f *files) Write(ctx context.Context, p string, r io.Reader, opt sandbox.WriteOptions) (api.FileInfo, error) {
	abs, rel, err := resolve(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	if rel == "." {
		return api.FileInfo{}, errdefs.New(errdefs.Invalid, sandbox.CodeIsADirectory, "%s is a directory", abs)
	}
	if !(*Sandbox)(f).writable(rel) {
		return api.FileInfo{}, (*Sandbox)(f).readOnly(abs)
	}
	if err := (*Sandbox)(f).enter(); err != nil {
		return api.FileInfo{}, err
	}
	defer f.ops.leave()
	dir := path.Dir(rel)
	if opt.Parents && dir != "." {
		if err := f.work.MkdirAll(dir, 0o755); err != nil {
			return api.FileInfo{}, fileError(path.Dir(abs), err)
		}
	}
	if fi, err := f.work.Lstat(rel); err == nil && fi.IsDir() {
		return api.FileInfo{}, errdefs.New(errdefs.Invalid, sandbox.CodeIsADirectory, "%s is a directory", abs)
	}
	mode := fs.FileMode(opt.Mode).Perm()
	if opt.Mode == 0 {
		mode = 0o644
	}
	var suffix [8]byte
	rand.Read(suffix[:])
	tmp := path.Join(dir, ".dsec-write-"+hex.EncodeToString(suffix[:]))
	fh, err := f.work.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
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
			f.work.Remove(tmp)
		}
	}()
	src := io.Reader(ctxReader{ctx: ctx, life: f.life, r: r})
	if opt.MaxBytes > 0 {
		src = io.LimitReader(src, opt.MaxBytes+1)
	}
	n, err := io.Copy(fh, src)
	if err != nil {
		return api.FileInfo{}, fileError(abs, err)
	}
	if opt.MaxBytes > 0 && n > opt.MaxBytes {
		return api.FileInfo{}, errdefs.New(errdefs.TooLarge, sandbox.CodeFileTooLarge, "%s would be larger than %d bytes", abs, opt.MaxBytes)
	}
	if err := fh.Chmod(mode); err != nil {
		return api.FileInfo{}, fileError(abs, err)
	}
	if err := fh.Close(); err != nil {
		return api.FileInfo{}, fileError(abs, err)
	}
	if err := f.work.Rename(tmp, rel); err != nil {
		return api.FileInfo{}, fileError(abs, err)
	}
	done = true
	return f.stat(abs, rel)
}

type readCloser struct {
	io.Reader
	io.Closer
}

// ctxReader stops a copy once the request or the sandbox ends.
type ctxReader struct {
	ctx, life context.Context
	r         io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	if c.life.Err() != nil {
		return 0, os.ErrClosed
	}
	return c.r.Read(p)
}

// List implements sandbox.Files. Entries are sorted by path.
func (f *files) List(ctx context.Context, p string, depth int) ([]api.FileInfo, error) {
	abs, rel, err := resolve(p)
	if err != nil {
		return nil, err
	}
	depth = min(max(depth, 1), maxListDepth)
	if err := (*Sandbox)(f).enter(); err != nil {
		return nil, err
	}
	defer f.ops.leave()
	fi, err := f.work.Lstat(rel)
	if err != nil {
		return nil, fileError(abs, err)
	}
	if !fi.IsDir() {
		return nil, errdefs.New(errdefs.Invalid, sandbox.CodeNotADirectory, "%s is not a directory", abs)
	}
	out := []api.FileInfo{}
	if err := f.list(ctx, abs, rel, depth, &out); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b api.FileInfo) int {
		switch {
		case a.Path < b.Path:
			return -1
		case a.Path > b.Path:
			return 1
		}
		return 0
	})
	return out, nil
}

func (f *files) list(ctx context.Context, abs, rel string, depth int, out *[]api.FileInfo) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	dir, err := f.work.Open(rel)
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
		info, err := f.stat(childAbs, childRel)
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
			if err := f.list(ctx, childAbs, childRel, depth-1, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// Stat implements sandbox.Files.
func (f *files) Stat(ctx context.Context, p string) (api.FileInfo, error) {
	abs, rel, err := resolve(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	if err := (*Sandbox)(f).enter(); err != nil {
		return api.FileInfo{}, err
	}
	defer f.ops.leave()
	return f.stat(abs, rel)
}

// Mkdir implements sandbox.Files.
func (f *files) Mkdir(ctx context.Context, p string, parents bool) (api.FileInfo, error) {
	abs, rel, err := resolve(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	if !(*Sandbox)(f).writable(rel) {
		return api.FileInfo{}, (*Sandbox)(f).readOnly(abs)
	}
	if err := (*Sandbox)(f).enter(); err != nil {
		return api.FileInfo{}, err
	}
	defer f.ops.leave()
	if parents {
		err = f.work.MkdirAll(rel, 0o755)
	} else {
		err = f.work.Mkdir(rel, 0o755)
	}
	if err != nil {
		return api.FileInfo{}, fileError(abs, err)
	}
	return f.stat(abs, rel)
}

// Remove implements sandbox.Files. The workspace itself cannot be removed.
func (f *files) Remove(ctx context.Context, p string, recursive bool) error {
	abs, rel, err := resolve(p)
	if err != nil {
		return err
	}
	if !(*Sandbox)(f).writable(rel) {
		return (*Sandbox)(f).readOnly(abs)
	}
	if rel == "." {
		return errdefs.New(errdefs.Invalid, sandbox.CodePathIsRoot, "%s cannot be removed", FileRoot)
	}
	if err := (*Sandbox)(f).enter(); err != nil {
		return err
	}
	defer f.ops.leave()
	if _, err := f.work.Lstat(rel); err != nil {
		return fileError(abs, err)
	}
	if recursive {
		err = f.work.RemoveAll(rel)
	} else {
		err = f.work.Remove(rel)
		if errors.Is(err, syscall.EEXIST) {
			err = &fs.PathError{Op: "remove", Path: rel, Err: syscall.ENOTEMPTY}
		}
	}
	return fileError(abs, err)
}

// Rename implements sandbox.Files.
func (f *files) Rename(ctx context.Context, from, to string) (api.FileInfo, error) {
	fromAbs, fromRel, err := resolve(from)
	if err != nil {
		return api.FileInfo{}, err
	}
	toAbs, toRel, err := resolve(to)
	if err != nil {
		return api.FileInfo{}, err
	}
	if fromRel == "." || toRel == "." {
		return api.FileInfo{}, errdefs.New(errdefs.Invalid, sandbox.CodePathIsRoot, "%s cannot be renamed or replaced", FileRoot)
	}
	for _, w := range [][2]string{{fromAbs, fromRel}, {toAbs, toRel}} {
		if !(*Sandbox)(f).writable(w[1]) {
			return api.FileInfo{}, (*Sandbox)(f).readOnly(w[0])
		}
	}
	if err := (*Sandbox)(f).enter(); err != nil {
		return api.FileInfo{}, err
	}
	defer f.ops.leave()
	if _, err := f.work.Lstat(fromRel); err != nil {
		return api.FileInfo{}, fileError(fromAbs, err)
	}
	if err := f.work.Rename(fromRel, toRel); err != nil {
		return api.FileInfo{}, fileError(toAbs, err)
	}
	return f.stat(toAbs, toRel)
}
