package blobstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// ObjectBucket is the JetStream object store bucket of the NATS store.
const ObjectBucket = "dsec_blobs"

// NATS stores blobs in a JetStream object store, so that every node of a
// cluster reaches them through the connection it already has. Range
// reads stream from the start of the object and skip; lazy loading will
// want a store with native ranges (S3) or chunk objects.
type NATS struct {
	obs jetstream.ObjectStore
}

// NewNATS opens (creating if needed) the blob bucket on nc.
func NewNATS(ctx context.Context, nc *nats.Conn, replicas int) (*NATS, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if replicas == 0 {
		replicas = 1
	}
	obs, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket: ObjectBucket, Description: "DSec blobs (layer files)", Storage: jetstream.FileStorage, Replicas: replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("opening blob bucket: %w", err)
	}
	return &NATS{obs: obs}, nil
}

func objectName(digest string) (string, error) {
	if !digestPattern.MatchString(digest) {
		return "", errdefs.New(errdefs.Invalid, "invalid_digest", "digest %q is not sha256:<64 hex digits>", digest)
	}
	return strings.TrimPrefix(digest, "sha256:"), nil
}

func (s *NATS) mapErr(digest string, err error) error {
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return notFound(digest)
	}
	return err
}

// Put implements Store. The content is hashed while it streams in; on a
// mismatch the object is deleted again.
func (s *NATS) Put(ctx context.Context, digest string, r io.Reader) (Info, error) {
	name, err := objectName(digest)
	if err != nil {
		return Info{}, err
	}
	if info, err := s.Stat(ctx, digest); err == nil {
		if _, err := io.Copy(io.Discard, r); err != nil {
			return Info{}, err
		}
		return info, nil
	}
	h := sha256.New()
	oi, err := s.obs.Put(ctx, jetstream.ObjectMeta{Name: name}, io.TeeReader(r, h))
	if err != nil {
		return Info{}, fmt.Errorf("storing blob %s: %w", digest, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		_ = s.obs.Delete(ctx, name)
		return Info{}, errdefs.New(errdefs.Invalid, "digest_mismatch", "blob content has digest %s, not %s", got, digest)
	}
	return Info{Digest: digest, Size: int64(oi.Size)}, nil
}

// Stat implements Store.
func (s *NATS) Stat(ctx context.Context, digest string) (Info, error) {
	name, err := objectName(digest)
	if err != nil {
		return Info{}, err
	}
	oi, err := s.obs.GetInfo(ctx, name)
	if err != nil {
		return Info{}, s.mapErr(digest, err)
	}
	return Info{Digest: digest, Size: int64(oi.Size)}, nil
}

// Open implements Store.
func (s *NATS) Open(ctx context.Context, digest string) (io.ReadCloser, Info, error) {
	name, err := objectName(digest)
	if err != nil {
		return nil, Info{}, err
	}
	res, err := s.obs.Get(ctx, name)
	if err != nil {
		return nil, Info{}, s.mapErr(digest, err)
	}
	oi, err := res.Info()
	if err != nil {
		res.Close()
		return nil, Info{}, err
	}
	return res, Info{Digest: digest, Size: int64(oi.Size)}, nil
}

// ReadRange implements Store.
func (s *NATS) ReadRange(ctx context.Context, digest string, off, n int64) (io.ReadCloser, error) {
	if off < 0 || n < 0 {
		return nil, errdefs.New(errdefs.Invalid, "invalid_range", "range %d+%d is not valid", off, n)
	}
	rc, _, err := s.Open(ctx, digest)
	if err != nil {
		return nil, err
	}
	if _, err := io.CopyN(io.Discard, rc, off); err != nil && !errors.Is(err, io.EOF) {
		rc.Close()
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(rc, n), rc}, nil
}

// Delete implements Store.
func (s *NATS) Delete(ctx context.Context, digest string) error {
	name, err := objectName(digest)
	if err != nil {
		return err
	}
	if err := s.obs.Delete(ctx, name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("deleting blob %s: %w", digest, err)
	}
	return nil
}

// List implements Store.
func (s *NATS) List(ctx context.Context) ([]Info, error) {
	infos, err := s.obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(infos))
	for _, oi := range infos {
		out = append(out, Info{Digest: "sha256:" + oi.Name, Size: int64(oi.Size)})
	}
	return out, nil
}
