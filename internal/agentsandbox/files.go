package agentsandbox

import (
	"context"
	"io"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Files is the files API the agent serves, over the sandbox's whole
// root: paths are cleaned here first (relative ones made absolute under
// sandbox.Workdir, where the agent starts commands), so that nothing
// malformed reaches the agent. checked, if set, sees each operation's
// error (op: "open", "write"…, or "path" when a path fails cleaning) and
// returns the one to pass on; a tier records refusals there.
func (a *Agent) Files(checked func(op, path string, err error) error) sandbox.Files {
	return files{agent: a, checked: checked}
}

type files struct {
	agent   *Agent
	checked func(op, path string, err error) error
}

var _ sandbox.Files = files{}

func (f files) check(op, p string, err error) error {
	if f.checked == nil {
		return err
	}
	return f.checked(op, p, err)
}

func (f files) call(p string) (*agentproto.Client, string, error) {
	c, err := f.agent.Client()
	if err != nil {
		return nil, "", err
	}
	clean, err := sandbox.CleanPath("/", p)
	if err != nil {
		return nil, "", f.check("path", p, err)
	}
	return c, clean, nil
}

func (f files) Open(ctx context.Context, p string) (io.ReadCloser, api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return nil, api.FileInfo{}, err
	}
	rc, fi, err := c.Open(ctx, p)
	return rc, fi, f.check("open", p, err)
}

func (f files) Write(ctx context.Context, p string, r io.Reader, opt sandbox.WriteOptions) (api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	fi, err := c.Write(ctx, p, r, opt)
	return fi, f.check("write", p, err)
}

func (f files) List(ctx context.Context, p string, depth int) ([]api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return nil, err
	}
	l, err := c.List(ctx, p, depth)
	return l, f.check("list", p, err)
}

func (f files) Stat(ctx context.Context, p string) (api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	fi, err := c.Stat(ctx, p)
	return fi, f.check("stat", p, err)
}

func (f files) Mkdir(ctx context.Context, p string, parents bool) (api.FileInfo, error) {
	c, p, err := f.call(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	fi, err := c.Mkdir(ctx, p, parents)
	return fi, f.check("mkdir", p, err)
}

func (f files) Remove(ctx context.Context, p string, recursive bool) error {
	c, p, err := f.call(p)
	if err != nil {
		return err
	}
	return f.check("remove", p, c.Remove(ctx, p, recursive))
}

func (f files) Rename(ctx context.Context, from, to string) (api.FileInfo, error) {
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
