package store

import (
	"context"

	"github.com/dsec-dev/dsec/api"
)

// PutNode records a node's heartbeat.
func (s *Store) PutNode(ctx context.Context, n api.Node) error {
	_, err := put(ctx, s.nodes, n.ID, "node", n)
	return err
}

// ListNodes returns the nodes that heartbeated within the bucket's TTL.
func (s *Store) ListNodes(ctx context.Context) ([]api.Node, error) {
	return list[api.Node](ctx, s.nodes, "node")
}

// DeleteNode removes a node's record (on clean shutdown).
func (s *Store) DeleteNode(ctx context.Context, id string) error {
	return s.nodes.Delete(ctx, id)
}
