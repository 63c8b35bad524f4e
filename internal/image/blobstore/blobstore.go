// Package blobstore stores content-addressed blobs (layer files today)
// behind one interface with range reads. The local-directory store is the
// default; an S3-compatible store and on-demand loading plug in behind the
// same interface later.
package blobstore

import (
	"context"
	"errors"
	"io"
)

// Info describes a stored blob.
type Info struct {
	Digest string // "sha256:<hex>"
	Size   int64
}

// Store is a content-addressed blob store. Implementations are safe for
// concurrent use. Errors for absent blobs wrap errdefs.NotFound (class).
type Store interface {
	// Put stores r's content, which must have the given digest (verified
	// while writing; a mismatch stores nothing and fails with class
	// Invalid). An existing blob makes Put a no-op that still drains r.
	Put(ctx context.Context, digest string, r io.Reader) (Info, error)
	// Stat describes a blob.
	Stat(ctx context.Context, digest string) (Info, error)
	// Open returns a reader of the whole blob.
	Open(ctx context.Context, digest string) (io.ReadCloser, Info, error)
	// ReadRange returns a reader of n bytes from offset off (fewer at the
	// end of the blob).
	ReadRange(ctx context.Context, digest string, off, n int64) (io.ReadCloser, error)
	// Delete removes a blob; deleting an absent blob succeeds.
	Delete(ctx context.Context, digest string) error
	// List returns every stored blob.
	List(ctx context.Context) ([]Info, error)
}

// ContextReader reads r until ctx ends: a copy of a blob stops then, and
// an end of r that came with ctx's end is reported as ctx's error (a
// source cut short by cancellation must not pass for a short blob).
func ContextReader(ctx context.Context, r io.Reader) io.Reader { return ctxReader{ctx, r} }

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(p)
	if errors.Is(err, io.EOF) && c.ctx.Err() != nil {
		err = c.ctx.Err()
	}
	return n, err
}
