package client

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/api"
)

// pattern holds bytes i%251, enough for any offset into a 64 KiB window.
var pattern = func() []byte {
	b := make([]byte, 64<<10+251)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}()

// patternAt returns the pattern's bytes at offset off, at most n of them.
func patternAt(off int64, n int) []byte {
	start := int(off % 251)
	return pattern[start : start+min(n, 64<<10)]
}

// patternReader produces n bytes of the pattern on demand and counts what
// it has handed out.
type patternReader struct {
	n, off   int64
	produced *atomic.Int64
}

func (r *patternReader) Read(p []byte) (int, error) {
	if r.off >= r.n {
		return 0, io.EOF
	}
	n := copy(p[:min(int64(len(p)), r.n-r.off)], patternAt(r.off, len(p)))
	r.off += int64(n)
	r.produced.Add(int64(n))
	return n, nil
}

func TestWriteFileStreams(t *testing.T) {
	const size = 100 << 20
	// The client may run ahead of the server by its buffers and the socket
	// buffers, never by the whole body.
	const maxLag = 32 << 20
	var produced atomic.Int64
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut || r.URL.Query().Get("path") != "/data/big.bin" {
			t.Errorf("request %s %s", r.Method, r.URL)
		}
		if r.ContentLength != -1 || len(r.TransferEncoding) == 0 || r.TransferEncoding[0] != "chunked" {
			t.Errorf("ContentLength %d, TransferEncoding %v; want a chunked stream", r.ContentLength, r.TransferEncoding)
		}
		if got := r.Header.Get("Content-Type"); got != "application/octet-stream" {
			t.Errorf("Content-Type = %q", got)
		}
		buf := make([]byte, 64<<10)
		var received, lag int64
		for {
			n, err := r.Body.Read(buf)
			if !bytes.Equal(buf[:n], patternAt(received, n)) {
				t.Errorf("bytes from %d corrupt", received)
				return
			}
			received += int64(n)
			lag = max(lag, produced.Load()-received)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Error(err)
				return
			}
		}
		if lag > maxLag {
			t.Errorf("client read %d bytes ahead of the server, want at most %d", lag, maxLag)
		}
		writeJSON(w, http.StatusOK, api.FileInfo{Path: "/data/big.bin", Type: api.FileTypeFile, Size: received})
	})
	fi, err := c.WriteFile(context.Background(), "sb-1", "/data/big.bin", &patternReader{n: size, produced: &produced}, WriteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size != size {
		t.Errorf("server stored %d bytes, want %d", fi.Size, size)
	}
}

func TestWriteFileLength(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "in"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("0123456789"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(4, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		r    io.Reader
		want string
	}{
		{"bytes.Reader", bytes.NewReader([]byte("abc")), "abc"},
		{"strings.Reader", strings.NewReader("hello"), "hello"},
		{"empty", strings.NewReader(""), ""},
		{"os.File from its offset", f, "456789"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				if string(body) != tt.want || r.ContentLength != int64(len(tt.want)) {
					t.Errorf("server got %q with ContentLength %d, want %q with its length", body, r.ContentLength, tt.want)
				}
				writeJSON(w, http.StatusOK, api.FileInfo{Size: int64(len(body))})
			})
			if _, err := c.WriteFile(context.Background(), "sb-1", "x", tt.r, WriteOptions{}); err != nil {
				t.Fatal(err)
			}
		})
	}
	if _, err := f.Stat(); err != nil {
		t.Errorf("WriteFile closed the caller's file: %v", err)
	}
}

func TestReadFileStreams(t *testing.T) {
	const chunk = 1 << 20
	received := make(chan struct{})
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/sandboxes/sb-1/files" || r.URL.Query().Get("path") != "a b&c.txt" {
			t.Errorf("request %s", r.URL)
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(bytes.Repeat([]byte{'a'}, chunk))
		_ = http.NewResponseController(w).Flush()
		select { // the rest only once the client has the first chunk
		case <-received:
		case <-time.After(10 * time.Second):
			t.Error("client did not get the first chunk before the end of the body")
		}
		_, _ = w.Write(bytes.Repeat([]byte{'b'}, chunk))
	})
	rc, err := c.ReadFile(context.Background(), "sb-1", "a b&c.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, make([]byte, chunk)); err != nil {
		t.Fatal(err)
	}
	close(received)
	rest, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	if len(rest) != chunk || rest[0] != 'b' {
		t.Errorf("got %d more bytes, want %d of 'b'", len(rest), chunk)
	}
}

func TestReadFileNotFound(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, api.Error{Code: "file_not_found", Message: "no such file", Class: ClassNotFound})
	})
	if _, err := c.ReadFileBytes(context.Background(), "sb-1", "/nope"); !IsNotFound(err) {
		t.Fatalf("ReadFileBytes error = %v, want not found", err)
	}
}

func TestFileRequests(t *testing.T) {
	type seen struct {
		Method, Path, Query, Body string
	}
	tests := []struct {
		name string
		call func(*Client) error
		want seen
	}{
		{
			name: "write with mode and parents",
			call: func(c *Client) error {
				_, err := c.WriteFile(context.Background(), "sb-1", "/w/x.sh", strings.NewReader("#!"), WriteOptions{Mode: 0o755, Parents: true})
				return err
			},
			want: seen{"PUT", "/v1/sandboxes/sb-1/files", "mode=0755&parents=true&path=%2Fw%2Fx.sh", "#!"},
		},
		{
			name: "list with depth",
			call: func(c *Client) error { _, err := c.ListFiles(context.Background(), "sb-1", "/w", 3); return err },
			want: seen{"GET", "/v1/sandboxes/sb-1/files/list", "depth=3&path=%2Fw", ""},
		},
		{
			name: "stat",
			call: func(c *Client) error { _, err := c.StatFile(context.Background(), "sb-1", "f"); return err },
			want: seen{"GET", "/v1/sandboxes/sb-1/files/stat", "path=f", ""},
		},
		{
			name: "exists",
			call: func(c *Client) error { _, err := c.Exists(context.Background(), "sb-1", "f"); return err },
			want: seen{"GET", "/v1/sandboxes/sb-1/files/exists", "path=f", ""},
		},
		{
			name: "remove recursive",
			call: func(c *Client) error { return c.RemoveFile(context.Background(), "sb-1", "/w", true) },
			want: seen{"DELETE", "/v1/sandboxes/sb-1/files", "path=%2Fw&recursive=true", ""},
		},
		{
			name: "mkdir",
			call: func(c *Client) error { _, err := c.Mkdir(context.Background(), "sb-1", "/w/d", true); return err },
			want: seen{"POST", "/v1/sandboxes/sb-1/files/mkdir", "", `{"path":"/w/d","parents":true}`},
		},
		{
			name: "rename",
			call: func(c *Client) error { _, err := c.Rename(context.Background(), "sb-1", "a", "b"); return err },
			want: seen{"POST", "/v1/sandboxes/sb-1/files/rename", "", `{"from":"a","to":"b"}`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got seen
			c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				got = seen{r.Method, r.URL.Path, r.URL.Query().Encode(), string(body)}
				switch r.Method {
				case http.MethodDelete:
					w.WriteHeader(http.StatusNoContent)
				default:
					writeJSON(w, http.StatusOK, api.FileInfo{})
				}
			})
			if err := tt.call(c); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("request mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
