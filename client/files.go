package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"

	"github.com/dsec-dev/dsec/api"
)

// filesPath returns …/files{suffix}?path=p.
func filesPath(id, suffix, p string) (string, error) {
	return sandboxPath(id, "/files"+suffix+"?path="+url.QueryEscape(p))
}

// ReadFile opens the file at path in the sandbox id for streaming; the
// caller must close it. Paths are absolute or relative to /workspace, the
// working directory of commands, on every tier. Only ctx bounds the
// download.
func (c *Client) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	p, err := filesPath(id, "", path)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(ctx, &request{method: http.MethodGet, path: p, accept: hdrOctet})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ReadFileBytes returns the whole content of the file at path.
func (c *Client) ReadFileBytes(ctx context.Context, id, path string) ([]byte, error) {
	ctx, cancel := c.withTimeout(ctx, 0)
	defer cancel()
	rc, err := c.ReadFile(ctx, id, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return b, nil
}

// WriteOptions are the options of WriteFile.
type WriteOptions struct {
	// Mode holds the permission bits (default 0644).
	Mode os.FileMode
	// Parents creates missing parent directories.
	Parents bool
}

// WriteFile streams r into the file at path, replacing it atomically, and
// returns the written file's description. r is read once, not buffered.
// The length is sent when r is a regular *os.File or has a Len() int
// method that counts its unread bytes (as *bytes.Reader, *bytes.Buffer and
// *strings.Reader do); otherwise the body is chunked. An *os.File is read
// from its current offset and not closed. Uploads are never retried; only
// ctx bounds them.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, opts WriteOptions) (*api.FileInfo, error) {
	p, err := filesPath(id, "", path)
	if err != nil {
		return nil, err
	}
	if opts.Mode != 0 {
		p += "&mode=0" + strconv.FormatUint(uint64(opts.Mode.Perm()), 8)
	}
	if opts.Parents {
		p += "&parents=true"
	}
	resp, err := c.send(ctx, &request{
		method: http.MethodPut, path: p,
		stream: r, size: bodySize(r),
		accept: hdrJSON, ctype: hdrOctet,
	})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var fi api.FileInfo
	if err := json.NewDecoder(resp.Body).Decode(&fi); err != nil {
		return nil, fmt.Errorf("decoding upload response: %w", err)
	}
	return &fi, nil
}

// bodySize returns the number of bytes left in r, or -1 if unknown.
func bodySize(r io.Reader) int64 {
	switch v := r.(type) {
	case interface{ Len() int }:
		return int64(v.Len())
	case *os.File:
		fi, err := v.Stat()
		// Files in /proc and the like claim size 0: stream them.
		if err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
			return -1
		}
		off, err := v.Seek(0, io.SeekCurrent)
		if err != nil {
			return -1
		}
		return max(fi.Size()-off, 0)
	}
	return -1
}

// ListFiles lists the directory at path, to depth levels (0: the server's
// default, 1).
func (c *Client) ListFiles(ctx context.Context, id, path string, depth int) (*api.FileList, error) {
	p, err := filesPath(id, "/list", path)
	if err != nil {
		return nil, err
	}
	if depth > 0 {
		p += "&depth=" + strconv.Itoa(depth)
	}
	var l api.FileList
	if err := c.call(ctx, http.MethodGet, p, nil, &l, 0); err != nil {
		return nil, err
	}
	return &l, nil
}

// StatFile describes the file at path.
func (c *Client) StatFile(ctx context.Context, id, path string) (*api.FileInfo, error) {
	p, err := filesPath(id, "/stat", path)
	if err != nil {
		return nil, err
	}
	var fi api.FileInfo
	if err := c.call(ctx, http.MethodGet, p, nil, &fi, 0); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Exists reports whether path exists in the sandbox id.
func (c *Client) Exists(ctx context.Context, id, path string) (bool, error) {
	p, err := filesPath(id, "/exists", path)
	if err != nil {
		return false, err
	}
	var e api.ExistsResponse
	if err := c.call(ctx, http.MethodGet, p, nil, &e, 0); err != nil {
		return false, err
	}
	return e.Exists, nil
}

// Mkdir makes the directory path and, if parents, its missing parents.
func (c *Client) Mkdir(ctx context.Context, id, path string, parents bool) (*api.FileInfo, error) {
	p, err := sandboxPath(id, "/files/mkdir")
	if err != nil {
		return nil, err
	}
	var fi api.FileInfo
	if err := c.call(ctx, http.MethodPost, p, api.MkdirRequest{Path: path, Parents: parents}, &fi, 0); err != nil {
		return nil, err
	}
	return &fi, nil
}

// RemoveFile removes the file or directory path; a non-empty directory
// only if recursive.
func (c *Client) RemoveFile(ctx context.Context, id, path string, recursive bool) error {
	p, err := filesPath(id, "", path)
	if err != nil {
		return err
	}
	if recursive {
		p += "&recursive=true"
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, 0)
}

// Rename renames from to to and returns the description of to.
func (c *Client) Rename(ctx context.Context, id, from, to string) (*api.FileInfo, error) {
	p, err := sandboxPath(id, "/files/rename")
	if err != nil {
		return nil, err
	}
	var fi api.FileInfo
	if err := c.call(ctx, http.MethodPost, p, api.RenameRequest{From: from, To: to}, &fi, 0); err != nil {
		return nil, err
	}
	return &fi, nil
}
