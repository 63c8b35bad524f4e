package agentproto

import (
	"context"
	"io"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Files is sandbox.Files served by an agent, for the tiers whose files
// the in-sandbox agent serves (container, microvm, vm): paths are cleaned
// here first (relative ones made absolute under sandbox.Workdir, where the
// agent starts commands), so that nothing malformed reaches it.
type Files struct {
	// Agent returns the sandbox's connection to its agent.
	Agent func() (*Client, error)
	// Checked, if set, sees each operation's error (op: "open",
	// "write"…, or "path" when a path fails cleaning) and returns the one
	// to pass on; a tier records refusals there.
	Checked func(op, path string, err error) error
}

var _ sandbox.Files = Files{}

func (f Files) check(op, p string, err error) error {
	if f.Checked == nil {
		return err
	}
	return f.Checked(op, p, err)
}

func (f Files) call(p string) (*Client, string, error) {
	c, err := f.Agent()
	if err != nil {
		return nil, "", err
	}
	clean, err := sandbox.CleanPath("/", p)
	if err != nil {
		return nil, "", f.check("path", p, err)
	}
	return c, clean, nil
}

func (f Files) Open(ctx context.Context, p string) (io.ReadCloser, api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return nil, api.FileInfo{}, err
	}
	rc, fi, err := c.Open(ctx, p)
	return rc, fi, f.check("open", p, err)
}

func (f Files) Write(ctx context.Context, p string, r io.Reader, opt sandbox.WriteOptions) (api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	fi, err := c.Write(ctx, p, r, opt)
	return fi, f.check("write", p, err)
}

func (f Files) List(ctx context.Context, p string, depth int) ([]api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return nil, err
	}
	l, err := c.List(ctx, p, depth)
	return l, f.check("list", p, err)
}

func (f Files) Stat(ctx context.Context, p string) (api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	fi, err := c.Stat(ctx, p)
	return fi, f.check("stat", p, err)
}

func (f Files) Mkdir(ctx context.Context, p string, parents bool) (api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	fi, err := c.Mkdir(ctx, p, parents)
	return fi, f.check("mkdir", p, err)
}

func (f Files) Remove(ctx context.Context, p string, recursive bool) error {
	c, p, err := f.call(p)
	if err != nil {
		return err
	}
	return f.check("remove", p, c.Remove(ctx, p, recursive))
}

func (f Files) Rename(ctx context.Context, from, to string) (api.FileInfo, error) {
	c, from, err := f.call(from)
	if err != nil {
		return api.FileInfo{}, err
	}
	clean, err := sandbox.CleanPath("/", to)
	if err != nil {
		return api.FileInfo{}, f.check("path", to, err)
	}
	fi, err := c.Rename(ctx, from, clean)
	return fi, f.check("rename", from+" -> "+clean, err)
}

// OutputTo is an Output that writes the streams to stdout and stderr
// (nil drops one; both nil: the output is collected into the result).
func OutputTo(stdout, stderr io.Writer) Output {
	if stdout == nil && stderr == nil {
		return Output{}
	}
	return Output{Stdout: writerFunc(stdout), Stderr: writerFunc(stderr)}
}

func writerFunc(w io.Writer) func([]byte) {
	if w == nil {
		return nil
	}
	return func(p []byte) { _, _ = w.Write(p) }
}
