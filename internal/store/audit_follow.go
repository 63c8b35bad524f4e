package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/api"
)

// FollowAuditEvents calls fn with sandbox id's audit events, oldest first
// after the first skip, then with each new one as it is stored, until ctx
// ends (nil) or fn fails (its error).
func (s *Store) FollowAuditEvents(ctx context.Context, id string, skip int, fn func(api.AuditEvent) error) error {
	stream, err := s.js.Stream(ctx, StreamAudit)
	if err != nil {
		return fmt.Errorf("opening stream %s: %w", StreamAudit, err)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{AuditSubjectPrefix + id}})
	if err != nil {
		return fmt.Errorf("following stream %s: %w", StreamAudit, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("following stream %s: %w", StreamAudit, err)
	}
	// Next blocks without a context: stopping the iterator ends it.
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	for seen := 0; ; seen++ {
		m, err := it.Next()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("following stream %s: %w", StreamAudit, err)
		}
		if seen < skip {
			continue
		}
		var e api.AuditEvent
		if json.Unmarshal(m.Data(), &e) != nil {
			continue
		}
		if err := fn(e); err != nil {
			return err
		}
	}
}
