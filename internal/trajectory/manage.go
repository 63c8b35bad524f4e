package trajectory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// List returns up to limit of owner's heads (every owner's if owner is
// ""), ordered by ID, the first after the ID after; next is the ID to
// pass as after for the next page, "" on the last. An owner's page reads
// that owner's index entries only.
func (s *Store) List(ctx context.Context, owner, after string, limit int) ([]Head, string, error) {
	if limit <= 0 || limit > MaxPage {
		limit = MaxPage
	}
	var ids []string
	var heads map[string]Head
	var err error
	if owner != "" {
		ids, err = s.ownerIDs(ctx, owner)
	} else {
		heads, err = s.allHeads(ctx)
		for id := range heads {
			ids = append(ids, id)
		}
	}
	if err != nil {
		return nil, "", err
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	i, _ := slices.BinarySearch(ids, after)
	if i < len(ids) && ids[i] == after {
		i++
	}
	out := []Head{}
	for ; i < len(ids) && len(out) < limit; i++ {
		h, ok := heads[ids[i]]
		if heads == nil {
			h, _, err = s.Head(ctx, ids[i])
			if errors.Is(err, errdefs.NotFound) {
				continue // deleted since its entry was read, or its entry outlived it
			}
			if err != nil {
				return nil, "", err
			}
			ok = h.Owner == owner
		} else {
			s.mergeCounters(&h)
		}
		if ok {
			out = append(out, h)
		}
	}
	next := ""
	if i < len(ids) && len(out) > 0 {
		next = out[len(out)-1].ID
	}
	return out, next, nil
}

// ownerIDs reads owner's index entries: the IDs of its trajectories.
func (s *Store) ownerIDs(ctx context.Context, owner string) ([]string, error) {
	var ids []string
	err := s.watchAll(ctx, ownerPrefix(owner)+"*", func(v []byte) { ids = append(ids, string(v)) })
	return ids, err
}

func (s *Store) allHeads(ctx context.Context) (map[string]Head, error) {
	heads := map[string]Head{}
	err := s.watchAll(ctx, "h.*", func(v []byte) {
		var h Head
		if json.Unmarshal(v, &h) == nil {
			heads[h.ID] = h
		}
	})
	return heads, err
}

// watchAll calls fn with the current value of every key matching filter.
func (s *Store) watchAll(ctx context.Context, filter string, fn func([]byte)) error {
	w, err := s.heads.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("listing trajectories: %w", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("listing trajectories: %w", ctx.Err())
		case e, ok := <-w.Updates():
			if !ok || e == nil {
				return nil
			}
			fn(e.Value())
		}
	}
}

// Delete removes trajectory id: its steps, the blobs they name, its
// owner's index entry and its head, in that order, so that a delete that
// stopped half-way can be done again (the head goes last). Every blob
// under the trajectory's key goes, those named by no step (a step that
// failed after its output was stored) too. NotFound if there is no head.
// Snapshots' layers are not the log's: the control plane handles them.
func (s *Store) Delete(ctx context.Context, id string) error {
	h, _, err := s.readHead(ctx, id)
	if err != nil {
		return err
	}
	if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(subject(id))); err != nil {
		return fmt.Errorf("purging the log of %s: %w", id, err)
	}
	// Every blob of the trajectory goes, those of steps that failed to
	// log too: they live under its key.
	if err := s.purgeBlobs(ctx, id); err != nil {
		return fmt.Errorf("deleting the blobs of %s: %w", id, err)
	}
	if err := s.heads.Purge(ctx, ownerKey(h.Owner, id)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("deleting the index entry of %s: %w", id, err)
	}
	s.forget(id)
	if err := s.heads.Purge(ctx, headKey(id)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("deleting the head of %s: %w", id, err)
	}
	return nil
}

// stepBlobs lists the blobs a step names.
func stepBlobs(st *api.TrajectoryStep) []string {
	var out []string
	if e := st.Exec; e != nil {
		for _, d := range []string{e.StdoutBlob, e.StderrBlob} {
			if d != "" {
				out = append(out, d)
			}
		}
	}
	if f := st.File; f != nil && f.Digest != "" {
		out = append(out, f.Digest)
	}
	return out
}
