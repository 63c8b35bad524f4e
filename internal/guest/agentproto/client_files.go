package agentproto

import (
	"context"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// WriteOptions tune Client.Write; they are sandbox.WriteOptions.
type WriteOptions = sandbox.WriteOptions

// Open opens a regular file for reading; its content is streamed as the
// reader is read. ctx bounds the whole download, reads included, and the
// agent must make progress within DefaultCallTimeout. Close the reader to
// stop the download early.
func (c *Client) Open(ctx context.Context, path string) (io.ReadCloser, api.FileInfo, error) {
	ctx, cancel := context.WithCancel(ctx)
	st, err := c.s.open(ctx, OpOpen, PathArgs{Path: path})
	if err != nil {
		cancel()
		return nil, api.FileInfo{}, err
	}
	for {
		f, err := st.next(ctx, c.callTimeout)
		if err != nil {
			st.abandon()
			cancel()
			return nil, api.FileInfo{}, err
		}
		switch f.Type {
		case FrameReply:
			st.forget()
			cancel()
			if err := c.decodeReply(f, nil); err != nil {
				return nil, api.FileInfo{}, err
			}
			return nil, api.FileInfo{}, c.broken("open replied without a file")
		case FrameData:
			st.abandon()
			cancel()
			return nil, api.FileInfo{}, c.broken("file data before its description")
		case FrameEvent:
			var fi api.FileInfo
			if err := decodeJSON(f.Payload, &fi); err != nil {
				st.abandon()
				cancel()
				return nil, api.FileInfo{}, c.broken("undecodable file description: %v", err)
			}
			return &fileReader{c: c, st: st, ctx: ctx, cancel: cancel}, fi, nil
		}
	}
}

// fileReader reads a file download. It is not safe for concurrent use
// (io.Reader's usual contract) except for Close.
type fileReader struct {
	c      *Client
	st     *stream
	ctx    context.Context
	cancel context.CancelFunc
	buf    []byte
	err    error // sticky: io.EOF or the failure

	closeOnce sync.Once
	closed    atomic.Bool
}

func (r *fileReader) Read(p []byte) (int, error) {
	if r.closed.Load() {
		return 0, os.ErrClosed
	}
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		f, err := r.st.next(r.ctx, r.c.callTimeout)
		if err != nil {
			r.err = err
			r.st.abandon()
			return 0, err
		}
		switch f.Type {
		case FrameData:
			r.buf = f.Payload
		case FrameReply:
			r.st.forget()
			r.cancel()
			if err := r.c.decodeReply(f, nil); err != nil {
				r.err = err
			} else {
				r.err = io.EOF
			}
		case FrameEvent:
			r.err = r.c.broken("unexpected event in a download")
			r.st.abandon()
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// Close stops the download if it has not ended.
func (r *fileReader) Close() error {
	r.closeOnce.Do(func() {
		r.closed.Store(true)
		r.st.abandon()
		r.cancel()
	})
	return nil
}

// Write replaces path with r's content, atomically on the agent (a
// temporary file in the same directory, renamed over path). The agent
// must take data within DefaultCallTimeout; ctx bounds the whole upload.
func (c *Client) Write(ctx context.Context, path string, r io.Reader, opt WriteOptions) (api.FileInfo, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.s.open(ctx, OpWrite, WriteArgs{Path: path, Mode: opt.Mode, Parents: opt.Parents, MaxBytes: opt.MaxBytes})
	if err != nil {
		return api.FileInfo{}, err
	}
	var fi api.FileInfo
	err = c.upload(ctx, st, r, &fi)
	return fi, err
}

// List lists a directory, descending depth levels (1 to 32), sorted by
// path.
func (c *Client) List(ctx context.Context, path string, depth int) ([]api.FileInfo, error) {
	out := []api.FileInfo{}
	err := c.listing(ctx, OpList, ListArgs{Path: path, Depth: depth}, func(line []byte) error {
		var fi api.FileInfo
		if err := decodeJSON(line, &fi); err != nil {
			return err
		}
		out = append(out, fi)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Stat describes a file without following a final symlink.
func (c *Client) Stat(ctx context.Context, path string) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.unary(ctx, OpStat, PathArgs{Path: path}, &fi)
	return fi, err
}

// Mkdir makes a directory, and its missing parents if parents is set.
func (c *Client) Mkdir(ctx context.Context, path string, parents bool) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.unary(ctx, OpMkdir, MkdirArgs{Path: path, Parents: parents}, &fi)
	return fi, err
}

// Remove removes a file or an empty directory, or a whole tree if
// recursive is set.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	return c.unary(ctx, OpRemove, RemoveArgs{Path: path, Recursive: recursive}, nil)
}

// Rename renames a file or directory, replacing the target if it may.
func (c *Client) Rename(ctx context.Context, from, to string) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.unary(ctx, OpRename, RenameArgs{From: from, To: to}, &fi)
	return fi, err
}
