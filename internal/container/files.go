package container

import (
	"context"
	"io"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Files implements sandbox.Sandbox: the agent serves them, confined to the
// sandbox's root; paths are checked here first so that nothing malformed
// reaches it.
func (s *Sandbox) Files() sandbox.Files { return (*files)(s) }

type files Sandbox

func (f *files) sb() *Sandbox { return (*Sandbox)(f) }

func (f *files) call(p string) (*agentproto.Client, string, error) {
	c, err := (*Sandbox)(f).agent()
	if err != nil {
		return nil, "", err
	}
	clean, err := sandbox.CleanPath("/", p)
	if err != nil {
		return nil, "", f.sb().refused("path", p, err)
	}
	return c, clean, nil
}

func (f *files) Open(ctx context.Context, p string) (io.ReadCloser, api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return nil, api.FileInfo{}, err
	}
	rc, fi, err := c.Open(ctx, p)
	return rc, fi, f.sb().refused("open", p, err)
}

func (f *files) Write(ctx context.Context, p string, r io.Reader, opt sandbox.WriteOptions) (api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	fi, err := c.Write(ctx, p, r, opt)
	return fi, f.sb().refused("write", p, err)
}

func (f *files) List(ctx context.Context, p string, depth int) ([]api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return nil, err
	}
	l, err := c.List(ctx, p, depth)
	return l, f.sb().refused("list", p, err)
}

func (f *files) Stat(ctx context.Context, p string) (api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	fi, err := c.Stat(ctx, p)
	return fi, f.sb().refused("stat", p, err)
}

func (f *files) Mkdir(ctx context.Context, p string, parents bool) (api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	fi, err := c.Mkdir(ctx, p, parents)
	return fi, f.sb().refused("mkdir", p, err)
}

func (f *files) Remove(ctx context.Context, p string, recursive bool) error {
	c, p, err := f.call(p)
	if err != nil {
		return err
	}
	return f.sb().refused("remove", p, c.Remove(ctx, p, recursive))
}

func (f *files) Rename(ctx context.Context, from, to string) (api.FileInfo, error) {
	c, from, err := f.call(from)
	if err != nil {
		return api.FileInfo{}, err
	}
	to, err = sandbox.CleanPath("/", to)
	if err != nil {
		return api.FileInfo{}, f.sb().refused("path", to, err)
	}
	fi, err := c.Rename(ctx, from, to)
	return fi, f.sb().refused("rename", from+" -> "+to, err)
}
