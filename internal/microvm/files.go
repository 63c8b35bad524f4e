package microvm

import (
	"context"
	"io"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Files implements sandbox.Sandbox: the guest's agent serves them, over
// the guest's whole root; paths are cleaned here first so that nothing
// malformed reaches it.
func (s *Sandbox) Files() sandbox.Files { return (*files)(s) }

type files Sandbox

func (f *files) call(p string) (*agentproto.Client, string, error) {
	c, err := (*Sandbox)(f).agent()
	if err != nil {
		return nil, "", err
	}
	clean, err := sandbox.CleanPath("/", p)
	if err != nil {
		return nil, "", err
	}
	return c, clean, nil
}

func (f *files) Open(ctx context.Context, p string) (io.ReadCloser, api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return nil, api.FileInfo{}, err
	}
	return c.Open(ctx, p)
}

func (f *files) Write(ctx context.Context, p string, r io.Reader, opt sandbox.WriteOptions) (api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	return c.Write(ctx, p, r, opt)
}

func (f *files) List(ctx context.Context, p string, depth int) ([]api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return nil, err
	}
	return c.List(ctx, p, depth)
}

func (f *files) Stat(ctx context.Context, p string) (api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	return c.Stat(ctx, p)
}

func (f *files) Mkdir(ctx context.Context, p string, parents bool) (api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	return c.Mkdir(ctx, p, parents)
}

func (f *files) Remove(ctx context.Context, p string, recursive bool) error {
	c, p, err := f.call(p)
	if err != nil {
		return err
	}
	return c.Remove(ctx, p, recursive)
}

func (f *files) Rename(ctx context.Context, from, to string) (api.FileInfo, error) {
	c, from, err := f.call(from)
	if err != nil {
		return api.FileInfo{}, err
	}
	if to, err = sandbox.CleanPath("/", to); err != nil {
		return api.FileInfo{}, err
	}
	return c.Rename(ctx, from, to)
}
