package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// A catalog is a bucket of immutable records addressed by ID ("sha256:…",
// under key i.<hex>) plus movable names (name:tag, under key n.<hash>)
// that point at IDs. Layers and images are catalogs.
type catalog[T any] struct {
	kv   jetstream.KeyValue
	what string // "layer", "image": for messages, and error codes (notFoundCodes)
}

// NameRecord points a name at an ID.
type NameRecord struct {
	Name    string `json:"name"`
	ID      string `json:"id"`
	Updated string `json:"updated"`
}

func idKey(id string) string { return "i." + strings.TrimPrefix(id, "sha256:") }

func nameKey(name string) string {
	h := sha256.Sum256([]byte(name))
	return "n." + hex.EncodeToString(h[:16])
}

func (c catalog[T]) notFound(ref string) error {
	return errdefs.New(errdefs.NotFound, notFoundCodes[c.what], "%s %q not found", c.what, ref)
}

// put stores rec under id unless it is already there (records are
// immutable, so an existing one is the same).
func (c catalog[T]) put(ctx context.Context, id string, rec T) error {
	_, err := create(ctx, c.kv, idKey(id), c.what, rec)
	if errors.Is(err, errdefs.Conflict) {
		return nil
	}
	return err
}

func (c catalog[T]) get(ctx context.Context, id string) (T, error) {
	rec, _, err := get[T](ctx, c.kv, idKey(id), c.what)
	if errors.Is(err, errdefs.NotFound) {
		return rec, c.notFound(id)
	}
	return rec, err
}

func (c catalog[T]) delete(ctx context.Context, id string) error {
	if err := c.kv.Purge(ctx, idKey(id)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	return nil
}

func (c catalog[T]) setName(ctx context.Context, n NameRecord) error {
	_, err := put(ctx, c.kv, nameKey(n.Name), c.what+" name", n)
	return err
}

func (c catalog[T]) getName(ctx context.Context, name string) (NameRecord, error) {
	n, _, err := get[NameRecord](ctx, c.kv, nameKey(name), c.what+" name")
	if errors.Is(err, errdefs.NotFound) {
		return n, c.notFound(name)
	}
	return n, err
}

func (c catalog[T]) deleteName(ctx context.Context, name string) error {
	if err := c.kv.Purge(ctx, nameKey(name)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	return nil
}

// list returns every record and every name.
func (c catalog[T]) list(ctx context.Context) ([]T, []NameRecord, error) {
	lister, err := c.kv.ListKeys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	defer lister.Stop()
	var recs []T
	var names []NameRecord
	for key := range lister.Keys() {
		switch {
		case strings.HasPrefix(key, "i."):
			r, _, err := get[T](ctx, c.kv, key, c.what)
			if err == nil {
				recs = append(recs, r)
			}
		case strings.HasPrefix(key, "n."):
			n, _, err := get[NameRecord](ctx, c.kv, key, c.what+" name")
			if err == nil {
				names = append(names, n)
			}
		}
	}
	return recs, names, nil
}
