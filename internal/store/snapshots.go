package store

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// SnapshotRecord is a snapshot and its owner. Its state layers are
// ordinary layer records and its image an ordinary image record (the
// sandbox's image with the state layers on top); this record says whose
// it is and where it came from.
type SnapshotRecord struct {
	api.Snapshot
	Owner string `json:"owner"`
}

// PutSnapshot stores a new snapshot record.
func (s *Store) PutSnapshot(ctx context.Context, r SnapshotRecord) error {
	_, err := create(ctx, s.snapKV, r.ID, "snapshot", r)
	return err
}

// UpdateSnapshot rewrites an existing snapshot record (a fork's, once its
// layer's upload says what it stored).
func (s *Store) UpdateSnapshot(ctx context.Context, r SnapshotRecord) error {
	_, rev, err := get[SnapshotRecord](ctx, s.snapKV, r.ID, "snapshot")
	if err != nil {
		return err
	}
	_, err = update(ctx, s.snapKV, r.ID, "snapshot", r, rev)
	return err
}

// GetSnapshot returns a snapshot; NotFound (snapshot_not_found) if absent.
func (s *Store) GetSnapshot(ctx context.Context, id string) (SnapshotRecord, error) {
	r, _, err := get[SnapshotRecord](ctx, s.snapKV, id, "snapshot")
	if errors.Is(err, errdefs.NotFound) {
		return r, errdefs.New(errdefs.NotFound, api.CodeSnapshotNotFound, "snapshot %q not found", id)
	}
	return r, err
}

// DeleteSnapshot removes a snapshot record (its layers stay until
// nothing uses them).
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	if err := s.snapKV.Purge(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	return nil
}

// ListSnapshots returns every snapshot record.
func (s *Store) ListSnapshots(ctx context.Context) ([]SnapshotRecord, error) {
	lister, err := s.snapKV.ListKeys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer lister.Stop()
	var out []SnapshotRecord
	for key := range lister.Keys() {
		if r, _, err := get[SnapshotRecord](ctx, s.snapKV, key, "snapshot"); err == nil {
			out = append(out, r)
		}
	}
	return out, nil
}
