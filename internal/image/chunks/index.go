// Package chunks describes a blob as fixed-size chunks: its chunk index,
// the SHA-256 of every chunk, by which a part of a blob fetched alone is
// checked. A layer's data blob has one (layer.json names it, so the
// layer's ID covers every chunk); lazyblob serves the blob on demand
// chunk by chunk against it. An Index is a value, safe to share.
package chunks

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
)

// MediaType identifies chunk indexes.
const MediaType = "application/vnd.dsec.chunk-index.v1+json"

// The chunk size: DefaultSize (the layers' own chunk size) unless
// chosen, a power of two from MinSize to MaxSize.
const (
	DefaultSize = layerspec.ChunkSize
	MinSize     = 4 << 10
	MaxSize     = 16 << 20
)

// Index is the chunk index of a blob: the blob is cut into chunks of
// ChunkSize bytes (the last one shorter) and Chunks holds each one's
// digest, in order. Its JSON form is what Build's result encodes
// to with encoding/json and Parse reads. An Index is a value: it
// is not changed once built or parsed.
type Index struct {
	MediaType string   `json:"media_type"`
	Digest    string   `json:"digest"` // the whole blob's, "sha256:<hex>"
	Size      int64    `json:"size"`
	ChunkSize int      `json:"chunk_size"`
	Chunks    []string `json:"chunks"` // "sha256:<hex>" of each chunk
}

// Build reads a blob of size bytes from r and returns its index
// with chunks of chunkSize bytes (0 means DefaultSize). r must hold
// exactly size bytes. Errors: class Invalid, code "invalid_chunk_index",
// for a chunk size out of bounds; an error wrapping io.ErrUnexpectedEOF
// if r holds fewer bytes, and class Invalid, code "invalid_range", if it
// holds more.
func Build(r io.Reader, size int64, chunkSize int) (Index, error) {
	if chunkSize == 0 {
		chunkSize = DefaultSize
	}
	if err := checkChunkSize(chunkSize); err != nil {
		return Index{}, err
	}
	if size < 0 {
		return Index{}, errdefs.New(errdefs.Invalid, api.CodeInvalidChunkIndex, "blob size %d is negative", size)
	}
	x := Index{MediaType: MediaType, Size: size, ChunkSize: chunkSize, Chunks: make([]string, 0, min(Count(size, chunkSize), 1<<16))}
	// The blob's digest and its chunks' are two hashes of the same
	// bytes: each chunk is hashed both ways at once, on two cores, while
	// the next is read (a snapshot's layer is indexed on a fork's path).
	whole := sha256.New()
	bufs := [2][]byte{make([]byte, chunkSize), make([]byte, chunkSize)}
	var wg sync.WaitGroup
	defer wg.Wait() // bounded: hashing a chunk in memory
	for i, off := 0, int64(0); off < size; i, off = i+1, off+int64(chunkSize) {
		buf := bufs[i%2]
		n := min(int64(chunkSize), size-off)
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return Index{}, fmt.Errorf("reading blob at %d: %w", off, err)
		}
		wg.Wait() // bounded: the previous chunk's whole-blob hashing
		wg.Add(1)
		go func() {
			defer wg.Done()
			whole.Write(buf[:n])
		}()
		x.Chunks = append(x.Chunks, Digest(buf[:n]))
	}
	wg.Wait() // bounded: the last chunk's whole-blob hashing
	if n, _ := io.ReadFull(r, bufs[0][:1]); n > 0 {
		return Index{}, errdefs.New(errdefs.Invalid, api.CodeInvalidRange, "blob holds more than %d bytes", size)
	}
	x.Digest = "sha256:" + hex.EncodeToString(whole.Sum(nil))
	return x, nil
}

// Parse decodes and validates an index in its JSON form. Errors:
// class Invalid, code "invalid_chunk_index", saying what is wrong.
func Parse(b []byte) (Index, error) {
	var x Index
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&x); err != nil {
		return Index{}, errdefs.Wrap(errdefs.Invalid, api.CodeInvalidChunkIndex, err, "chunk index is not valid JSON")
	}
	if dec.More() {
		return Index{}, errdefs.New(errdefs.Invalid, api.CodeInvalidChunkIndex, "chunk index has data after its JSON object")
	}
	if err := x.Validate(); err != nil {
		return Index{}, err
	}
	return x, nil
}

// Validate checks the index's own consistency (not the blob's content).
// Errors: class Invalid, code "invalid_chunk_index".
func (x Index) Validate() error {
	bad := func(format string, args ...any) error {
		return errdefs.New(errdefs.Invalid, api.CodeInvalidChunkIndex, "chunk index: "+format, args...)
	}
	switch {
	case x.MediaType != MediaType:
		return bad("media type %q, want %q", x.MediaType, MediaType)
	case !layerspec.ValidDigest(x.Digest):
		return bad("blob digest %q is not sha256:<64 hex digits>", x.Digest)
	case x.Size < 0:
		return bad("blob size %d is negative", x.Size)
	}
	if err := checkChunkSize(x.ChunkSize); err != nil {
		return err
	}
	if want := Count(x.Size, x.ChunkSize); len(x.Chunks) != want {
		return bad("%d chunk digests for %d bytes in chunks of %d, want %d", len(x.Chunks), x.Size, x.ChunkSize, want)
	}
	for i, d := range x.Chunks {
		if !layerspec.ValidDigest(d) {
			return bad("digest of chunk %d %q is not sha256:<64 hex digits>", i, d)
		}
	}
	return nil
}

// Equal reports whether x and y are the same index.
func (x Index) Equal(y Index) bool {
	return x.MediaType == y.MediaType && x.Digest == y.Digest && x.Size == y.Size &&
		x.ChunkSize == y.ChunkSize && slices.Equal(x.Chunks, y.Chunks)
}

// chunkRange returns the offset and length of chunk i.
func (x Index) Range(i int) (off, n int64) {
	off = int64(i) * int64(x.ChunkSize)
	return off, min(int64(x.ChunkSize), x.Size-off)
}

// hexDigest is the blob digest without "sha256:", the name of its file.
func (x Index) Hex() string { return x.Digest[len("sha256:"):] }

func checkChunkSize(n int) error {
	if n < MinSize || n > MaxSize || n&(n-1) != 0 {
		return errdefs.New(errdefs.Invalid, api.CodeInvalidChunkIndex,
			"chunk size %d is not a power of two from %d to %d", n, MinSize, MaxSize)
	}
	return nil
}

// chunkCount is the number of chunks of size bytes: the last one may be
// short; no bytes make no chunks.
func Count(size int64, chunkSize int) int {
	n := size / int64(chunkSize)
	if size%int64(chunkSize) != 0 {
		n++
	}
	return int(n)
}

func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}
