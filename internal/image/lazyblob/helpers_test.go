package lazyblob

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/dsec-dev/dsec/internal/image/blobstore"
	"github.com/dsec-dev/dsec/internal/image/chunks"
)

// storeBlob puts data into a new local blob store and returns the store
// and the blob's index (chunks of chunkSize; 0 means the default).
func storeBlob(t testing.TB, data []byte, chunkSize int) (*blobstore.Local, chunks.Index) {
	t.Helper()
	st, err := blobstore.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	idx, err := chunks.Build(bytes.NewReader(data), int64(len(data)), chunkSize)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(context.Background(), idx.Digest, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	return st, idx
}

// storeFile puts the file at path into st and returns its index.
func storeFile(t testing.TB, st *blobstore.Local, path string) chunks.Index {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	idx, err := chunks.Build(f, fi.Size(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(context.Background(), idx.Digest, f); err != nil {
		t.Fatal(err)
	}
	return idx
}

// corruptStored overwrites n bytes at off of the stored blob's file.
func corruptStored(t testing.TB, st *blobstore.Local, digest string, off int64, n int) {
	t.Helper()
	p, err := st.Path(digest)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0) // root writes the store's 0444 file
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xA5}, n), off); err != nil {
		t.Fatal(err)
	}
}

// countingSource is a real Source that counts the ranges read from it,
// by offset.
type countingSource struct {
	Source
	mu   sync.Mutex
	offs map[int64]int
}

func countReads(src Source) *countingSource {
	return &countingSource{Source: src, offs: map[int64]int{}}
}

func (c *countingSource) ReadRange(ctx context.Context, digest string, off, n int64) (io.ReadCloser, error) {
	c.mu.Lock()
	c.offs[off]++
	c.mu.Unlock()
	return c.Source.ReadRange(ctx, digest, off, n)
}

// reads returns the read counts by offset and their total.
func (c *countingSource) reads() (map[int64]int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out, total := map[int64]int{}, 0
	for k, v := range c.offs {
		out[k] = v
		total += v
	}
	return out, total
}

// stallSource blocks every read until its context ends, as a store
// that stopped answering but honours cancellation.
type stallSource struct{ calls chan struct{} }

func (s stallSource) ReadRange(ctx context.Context, digest string, off, n int64) (io.ReadCloser, error) {
	select {
	case s.calls <- struct{}{}:
	default:
	}
	<-ctx.Done() // bounded: the fetch's deadline ends ctx
	return nil, ctx.Err()
}

// deafSource blocks every read until release is closed, whatever its
// context: a store client that ignores cancellation.
type deafSource struct{ release chan struct{} }

func (s deafSource) ReadRange(ctx context.Context, digest string, off, n int64) (io.ReadCloser, error) {
	<-s.release // bounded: the test closes release in its cleanup
	return nil, errors.New("released")
}

// logBuffer is a logger whose records the test can read.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) contains(s string) bool { return strings.Contains(l.String(), s) }

func newLog() (*slog.Logger, *logBuffer) {
	lb := &logBuffer{}
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})), lb
}

func slogDiscard() *slog.Logger { return slog.New(slog.DiscardHandler) }
