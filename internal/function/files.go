package function

import (
	"context"
	"io"
	"os"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// files is a sandbox's files API: /workspace, reached only through an
// os.Root on the workspace directory so that no path, symlink or not,
// leads out of it (sandbox.RootFiles, as the in-sandbox agent's), behind
// the phase's writable paths and the sandbox's life.
type files Sandbox

var _ sandbox.Files = (*files)(nil)

// root is the workspace, as the files API serves it.
func (f *files) root() sandbox.RootFiles { return sandbox.RootFiles{Root: f.work, Name: FileRoot} }

// resolve cleans a user path and returns it and its path in the root.
func resolve(p string) (abs, rel string, err error) {
	return sandbox.RootFiles{Name: FileRoot}.Resolve(p)
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

// Write implements sandbox.Files (sandbox.RootFiles.Write: a temporary
// file renamed over the target). The request's and the sandbox's ends
// stop it.
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
	return f.root().Write(abs, rel, ctxReader{ctx: ctx, life: f.life, r: r}, opt)
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
	if err := (*Sandbox)(f).enter(); err != nil {
		return nil, err
	}
	defer f.ops.leave()
	return f.root().List(ctx, abs, rel, depth)
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
	return f.root().Stat(abs, rel)
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
	return f.root().Mkdir(abs, rel, parents)
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
	return f.root().Remove(abs, rel, recursive)
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
	return f.root().Rename(fromAbs, fromRel, toAbs, toRel)
}
