package noderpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/nats-io/nats.go"

	"github.com/dsec-dev/dsec/api"
)

// ListFiles lists a directory.
func (c *Client) ListFiles(ctx context.Context, node, id, path string, depth int) ([]api.FileInfo, error) {
	var l api.FileList
	err := c.request(ctx, node, OpFileList, FileRequest{ID: id, Path: path, Depth: depth}, &l)
	return l.Entries, err
}

// Stat describes a file.
func (c *Client) Stat(ctx context.Context, node, id, path string) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.request(ctx, node, OpFileStat, FileRequest{ID: id, Path: path}, &fi)
	return fi, err
}

// Mkdir makes a directory.
func (c *Client) Mkdir(ctx context.Context, node, id, path string, parents bool) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.request(ctx, node, OpFileMkdir, FileRequest{ID: id, Path: path, Parents: parents, Step: StepOf(ctx)}, &fi)
	return fi, err
}

// Remove removes a file or directory.
func (c *Client) Remove(ctx context.Context, node, id, path string, recursive bool) error {
	return c.request(ctx, node, OpFileRemove, FileRequest{ID: id, Path: path, Recursive: recursive, Step: StepOf(ctx)}, nil)
}

// Rename renames a file or directory.
func (c *Client) Rename(ctx context.Context, node, id, from, to string) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.request(ctx, node, OpFileRename, FileRequest{ID: id, Path: from, To: to, Step: StepOf(ctx)}, &fi)
	return fi, err
}

// OpenFile opens a file for reading. The returned reader fetches the file
// in chunks as it is read; it must be closed.
func (c *Client) OpenFile(ctx context.Context, node, id, path string) (io.ReadCloser, api.FileInfo, error) {
	var resp OpenResponse
	if err := c.request(ctx, node, OpFileOpen, FileRequest{ID: id, Path: path}, &resp); err != nil {
		return nil, api.FileInfo{}, err
	}
	return &remoteReader{c: c, ctx: ctx, node: node, id: id, handle: resp.Handle}, resp.Info, nil
}

type remoteReader struct {
	c      *Client
	ctx    context.Context
	node   string
	id     string
	handle string
	off    int64
	buf    []byte
	eof    bool
	closed bool
}

func (r *remoteReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.eof {
			return 0, io.EOF
		}
		if r.closed {
			return 0, errors.New("read of closed remote file")
		}
		body, _ := json.Marshal(FileRequest{ID: r.id, Handle: r.handle, Offset: r.off})
		msg, err := r.c.roundTrip(r.ctx, r.node, &nats.Msg{Subject: Subject(r.node, OpFileRead), Data: body})
		if err != nil {
			return 0, err
		}
		r.buf = msg.Data
		r.off += int64(len(msg.Data))
		r.eof = msg.Header.Get(HdrEOF) != ""
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *remoteReader) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	if r.eof {
		return nil // the node closed the session with the last chunk
	}
	// Use a fresh context: the reader's may already be done, and the node
	// should free the handle either way (it also expires idle handles).
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	return r.c.request(ctx, r.node, OpFileClose, FileRequest{ID: r.id, Handle: r.handle}, nil)
}

// WriteFile streams r into path, replacing it atomically when r is
// exhausted. Nothing is written if r fails or ctx ends.
func (c *Client) WriteFile(ctx context.Context, node, id, path string, r io.Reader, opt FileRequest) (api.FileInfo, error) {
	opt.ID, opt.Path = id, path
	if opt.Step == 0 {
		opt.Step = StepOf(ctx)
	}
	buf := make([]byte, ChunkSize)
	var handle string
	for {
		n, rerr := io.ReadFull(r, buf)
		final := false
		switch {
		case rerr == io.EOF || rerr == io.ErrUnexpectedEOF:
			final = true
		case rerr != nil:
			c.abortWrite(node, id, handle)
			return api.FileInfo{}, fmt.Errorf("reading upload: %w", rerr)
		}
		req := opt
		req.Handle, req.Final = handle, final
		hdr, _ := json.Marshal(req)
		m := &nats.Msg{Subject: Subject(node, OpFileWrite), Header: nats.Header{HdrReq: []string{string(hdr)}}, Data: buf[:n]}
		reply, err := c.roundTrip(ctx, node, m)
		if err != nil {
			if handle != "" && !final {
				c.abortWrite(node, id, handle)
			}
			return api.FileInfo{}, err
		}
		var resp WriteResponse
		if err := json.Unmarshal(reply.Data, &resp); err != nil {
			return api.FileInfo{}, fmt.Errorf("decoding write reply from node %s: %w", node, err)
		}
		handle = resp.Handle
		if final {
			if resp.Info == nil {
				return api.FileInfo{}, fmt.Errorf("node %s finished a write without file info", node)
			}
			return *resp.Info, nil
		}
	}
}

// abortWrite discards a half-written upload; best effort, the node also
// expires idle sessions.
func (c *Client) abortWrite(node, id, handle string) {
	if handle == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	_ = c.request(ctx, node, OpFileClose, FileRequest{ID: id, Handle: handle}, nil)
}
