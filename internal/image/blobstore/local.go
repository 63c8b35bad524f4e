package blobstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Local stores blobs as files under Dir/sha256/<hex>. Writes go to a
// temporary file that is renamed into place once its digest checks out,
// so a blob is either absent or complete.
type Local struct {
	dir string
}

// NewLocal returns a store rooted at dir, creating it if needed.
func NewLocal(dir string) (*Local, error) {
	for _, d := range []string{filepath.Join(dir, "sha256"), filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating blob store: %w", err)
		}
	}
	return &Local{dir: dir}, nil
}

// Path returns the file holding digest (which may not exist). Node
// caches on the same host may use it directly instead of copying.
func (l *Local) Path(digest string) (string, error) {
	if !digestPattern.MatchString(digest) {
		return "", errdefs.New(errdefs.Invalid, api.CodeInvalidDigest, "digest %q is not sha256:<64 hex digits>", digest)
	}
	return filepath.Join(l.dir, "sha256", strings.TrimPrefix(digest, "sha256:")), nil
}

func notFound(digest string) error {
	return errdefs.New(errdefs.NotFound, api.CodeBlobNotFound, "blob %s not found", digest)
}

// Put implements Store.
func (l *Local) Put(ctx context.Context, digest string, r io.Reader) (Info, error) {
	p, err := l.Path(digest)
	if err != nil {
		return Info{}, err
	}
	if fi, err := os.Stat(p); err == nil {
		if _, err := io.Copy(io.Discard, r); err != nil {
			return Info{}, fmt.Errorf("reading blob %s: %w", digest, err)
		}
		return Info{Digest: digest, Size: fi.Size()}, nil
	}
	tmp, err := os.CreateTemp(filepath.Join(l.dir, "tmp"), "put-")
	if err != nil {
		return Info{}, fmt.Errorf("storing blob: %w", err)
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), ContextReader(ctx, r))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Info{}, fmt.Errorf("storing blob %s: %w", digest, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		return Info{}, errdefs.New(errdefs.Invalid, api.CodeDigestMismatch, "blob content has digest %s, not %s", got, digest)
	}
	if err := os.Chmod(tmp.Name(), 0o444); err != nil {
		return Info{}, err
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return Info{}, fmt.Errorf("storing blob %s: %w", digest, err)
	}
	return Info{Digest: digest, Size: n}, nil
}

// Stat implements Store.
func (l *Local) Stat(ctx context.Context, digest string) (Info, error) {
	p, err := l.Path(digest)
	if err != nil {
		return Info{}, err
	}
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, notFound(digest)
	}
	if err != nil {
		return Info{}, err
	}
	return Info{Digest: digest, Size: fi.Size()}, nil
}

// Open implements Store.
func (l *Local) Open(ctx context.Context, digest string) (io.ReadCloser, Info, error) {
	p, err := l.Path(digest)
	if err != nil {
		return nil, Info{}, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Info{}, notFound(digest)
	}
	if err != nil {
		return nil, Info{}, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, Info{}, err
	}
	return f, Info{Digest: digest, Size: fi.Size()}, nil
}

// ReadRange implements Store.
func (l *Local) ReadRange(ctx context.Context, digest string, off, n int64) (io.ReadCloser, error) {
	if off < 0 || n < 0 {
		return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidRange, "range %d+%d is not valid", off, n)
	}
	f, _, err := l.Open(ctx, digest)
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(f.(*os.File), off, n), f}, nil
}

// Delete implements Store.
func (l *Local) Delete(ctx context.Context, digest string) error {
	p, err := l.Path(digest)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("deleting blob %s: %w", digest, err)
	}
	return nil
}

// List implements Store.
func (l *Local) List(ctx context.Context) ([]Info, error) {
	ents, err := os.ReadDir(filepath.Join(l.dir, "sha256"))
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(ents))
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, Info{Digest: "sha256:" + e.Name(), Size: fi.Size()})
	}
	return out, nil
}
