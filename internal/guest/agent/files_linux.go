package agent

import (
	"bytes"
	"encoding/json"
	"io"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// The files API is the function tier's (sandbox.RootFiles) with the
// sandbox's whole root as the file root: the same checks, error codes and
// atomic writes, through an os.Root so that no path, symlink or not,
// leads out of Options.Root.

// fileRoot is the root the node sees.
const fileRoot = "/"

// files is the agent's root, as the files API serves it.
func (a *agent) files() sandbox.RootFiles { return sandbox.RootFiles{Root: a.root, Name: fileRoot} }

// resolve cleans a node path (a relative one is relative to
// sandbox.Workdir, where commands start) and returns it and its path in
// the root.
func resolve(p string) (abs, rel string, err error) {
	return sandbox.RootFiles{Name: fileRoot}.Resolve(p)
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
	streamFile(c, io.LimitReader(fh, fi.Size()), func(err error) error { return sandbox.FileError(abs, err) })
}

// write replaces a file with the call's data (sandbox.RootFiles.Write).
func (a *agent) write(c *agentproto.Call, args agentproto.WriteArgs) {
	abs, rel, err := resolve(args.Path)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	if rel == "." {
		c.Reply(nil, errdefs.New(errdefs.Invalid, sandbox.CodeIsADirectory, "%s is a directory", abs))
		return
	}
	opt := sandbox.WriteOptions{Mode: args.Mode, Parents: args.Parents, MaxBytes: args.MaxBytes}
	c.Reply(a.files().Write(abs, rel, &upload{c: c}, opt))
}

// upload reads the data the node sends on a call (ChanIn).
type upload struct {
	c   *agentproto.Call
	buf []byte
}

func (u *upload) Read(p []byte) (int, error) {
	for len(u.buf) == 0 {
		b, err := u.c.Recv(u.c.Context())
		if err != nil {
			return 0, err // io.EOF after the last chunk
		}
		u.buf = b
	}
	n := copy(p, u.buf)
	u.buf = u.buf[n:]
	return n, nil
}

// list streams a directory listing, sorted by path, as NDJSON.
func (a *agent) list(c *agentproto.Call, args agentproto.ListArgs) {
	abs, rel, err := resolve(args.Path)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	out, err := a.files().List(c.Context(), abs, rel, args.Depth)
	if err == nil {
		err = sendLines(c, out)
	}
	if err != nil {
		c.Reply(nil, err)
		return
	}
	c.Reply(struct{}{}, nil)
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
	c.Reply(a.files().Stat(abs, rel))
}

func (a *agent) mkdir(c *agentproto.Call, args agentproto.MkdirArgs) {
	abs, rel, err := resolve(args.Path)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	c.Reply(a.files().Mkdir(abs, rel, args.Parents))
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
	if err := a.files().Remove(abs, rel, args.Recursive); err != nil {
		c.Reply(nil, err)
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
	c.Reply(a.files().Rename(fromAbs, fromRel, toAbs, toRel))
}

// streamFile sends r to the caller in chunks on the output channel and
// replies at its end; wrap names a failure (a cancelled call included).
func streamFile(c *agentproto.Call, r io.Reader, wrap func(error) error) {
	for {
		if err := c.Context().Err(); err != nil {
			c.Reply(nil, wrap(err))
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
			c.Reply(nil, wrap(err))
			return
		}
	}
}
