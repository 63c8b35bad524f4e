// Package profiles keeps layers' access profiles: for each data blob, the
// chunks its sandboxes' readers asked for first, in order (see
// lazyblob's OnProfile), merged across runs and nodes in a JetStream
// key/value bucket, so that any node prefetches them as soon as it mounts
// the layer for a create (lazyblob.Server.Prefetch), before the sandbox
// asks.
//
// A profile is a hint: a missing or unreadable one costs only the
// prefetch, and a wrong one only bandwidth, since every chunk a prefetch
// fetches is checked against the blob's chunk index like any other.
package profiles

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/internal/natsbus"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
)

// Bucket is the key/value bucket of profiles, keyed by the blob's hex
// digest.
const Bucket = "dsec_profiles"

// MaxChunks is the most chunks a profile keeps (the first ones asked for
// win): 4 GiB of 1 MiB chunks.
const MaxChunks = 4096

// mergeTries bounds the compare-and-set retries of one Merge.
const mergeTries = 8

// Store keeps profiles. It is safe for concurrent use.
type Store struct {
	kv jetstream.KeyValue
}

// Open opens (creating it if needed) the profile bucket with replicas
// copies.
func Open(ctx context.Context, nc *nats.Conn, replicas int) (*Store, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := natsbus.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket: Bucket, Description: "DSec layers' access profiles", Storage: jetstream.FileStorage,
		Replicas: natsbus.Replicas(ctx, js, natsbus.KVStream(Bucket), replicas), History: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("opening the profile bucket: %w", err)
	}
	return &Store{kv: kv}, nil
}

func key(digest string) (string, error) {
	if !layerspec.ValidDigest(digest) {
		return "", errdefs.New(errdefs.Invalid, api.CodeInvalidDigest, "digest %q is not sha256:<64 hex digits>", digest)
	}
	return strings.TrimPrefix(digest, "sha256:"), nil
}

// Profile returns the profile of the blob named by digest: nil if there
// is none.
func (s *Store) Profile(ctx context.Context, digest string) ([]int, error) {
	k, err := key(digest)
	if err != nil {
		return nil, err
	}
	order, _, err := s.get(ctx, k)
	return order, err
}

func (s *Store) get(ctx context.Context, k string) ([]int, uint64, error) {
	e, err := s.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("reading profile %s: %w", k, err)
	}
	var order []int
	if err := json.Unmarshal(e.Value(), &order); err != nil {
		// A hint that does not parse is replaced by the next Merge.
		return nil, e.Revision(), nil
	}
	return order, e.Revision(), nil
}

// Merge adds order to the blob's profile: the chunks it has not, after
// those it has, up to MaxChunks. Writers on other nodes are merged with
// compare-and-set.
func (s *Store) Merge(ctx context.Context, digest string, order []int) error {
	k, err := key(digest)
	if err != nil {
		return err
	}
	for range mergeTries {
		have, rev, err := s.get(ctx, k)
		if err != nil {
			return err
		}
		merged := Union(have, order)
		if rev != 0 && len(merged) == len(have) {
			return nil // nothing new
		}
		b, err := json.Marshal(merged)
		if err != nil {
			return err
		}
		if rev == 0 {
			_, err = s.kv.Create(ctx, k, b)
		} else {
			_, err = s.kv.Update(ctx, k, b, rev)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !wrongRevision(err) {
			return fmt.Errorf("writing profile %s: %w", k, err)
		}
	}
	return errdefs.New(errdefs.Unavailable, api.CodeContention, "profile of %s is changing too fast", digest)
}

func wrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// Union is have followed by the entries of add it lacks (negative ones
// dropped), at most MaxChunks.
func Union(have, add []int) []int {
	out := slices.Clip(slices.Clone(have))
	seen := make(map[int]bool, len(have)+len(add))
	for _, c := range have {
		seen[c] = true
	}
	for _, c := range add {
		if len(out) >= MaxChunks {
			break
		}
		if c >= 0 && !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	if len(out) > MaxChunks {
		out = out[:MaxChunks]
	}
	return out
}
