package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketRequests holds idempotent creates' keys (a day).
const BucketRequests = "dsec_requests"

// RequestRecord is what an idempotent create's key holds: the sandbox it
// makes, and the digest of its request (a reuse of the key for another
// request is refused).
type RequestRecord struct {
	Sandbox string `json:"sandbox"`
	Digest  string `json:"digest"`
}

// ClaimRequest records key for rec, unless it is recorded: then it
// returns what it holds and claimed false.
func (s *Store) ClaimRequest(ctx context.Context, key string, rec RequestRecord) (RequestRecord, bool, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return RequestRecord{}, false, fmt.Errorf("encoding request record: %w", err)
	}
	for {
		_, err := s.requests.Create(ctx, key, b)
		if err == nil {
			return rec, true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return RequestRecord{}, false, storeErr(ctx, err, "recording request %s", key)
		}
		e, err := s.requests.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // released meanwhile: claim it again
		}
		if err != nil {
			return RequestRecord{}, false, storeErr(ctx, err, "reading request %s", key)
		}
		var got RequestRecord
		if err := json.Unmarshal(e.Value(), &got); err != nil {
			return RequestRecord{}, false, fmt.Errorf("decoding request %s: %w", key, err)
		}
		return got, false, nil
	}
}

// ReleaseRequest forgets key (its create made nothing: a retry may make
// the sandbox).
func (s *Store) ReleaseRequest(ctx context.Context, key string) error {
	if err := s.requests.Purge(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("releasing request %s: %w", key, err)
	}
	return nil
}
