package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/api"
)

// PutNode records a node's heartbeat.
func (s *Store) PutNode(ctx context.Context, n api.Node) error {
	_, err := put(ctx, s.nodes, n.ID, "node", n)
	return err
}

// ListNodes returns the nodes that heartbeated within the bucket's TTL.
// Each carries what operators set on it (cordon, drain).
func (s *Store) ListNodes(ctx context.Context) ([]api.Node, error) {
	nodes, err := list[api.Node](ctx, s.nodes, "node")
	if err != nil {
		return nil, err
	}
	admins, err := s.nodeAdmins(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, fmt.Errorf("listing nodes' settings: %w", err)
	}
	for i := range nodes {
		if a, ok := admins[nodes[i].ID]; ok {
			nodes[i].Cordoned, nodes[i].Draining, nodes[i].DrainDeadline = a.Cordoned || a.Draining, a.Draining, a.DrainDeadline
		}
	}
	return nodes, nil
}

// DeleteNode removes a node's record (on clean shutdown).
func (s *Store) DeleteNode(ctx context.Context, id string) error {
	return s.nodes.Delete(ctx, id)
}

// BucketNodeAdmin holds what operators set on nodes (cordon, drain); it
// outlives the nodes' heartbeats.
const BucketNodeAdmin = "dsec_node_admin"

// NodeAdmin is what operators set on a node.
type NodeAdmin struct {
	Cordoned      bool       `json:"cordoned,omitempty"`
	Draining      bool       `json:"draining,omitempty"`
	DrainDeadline *time.Time `json:"drain_deadline,omitempty"`
}

// SetNodeAdmin records a's for node id; the zero NodeAdmin clears it.
func (s *Store) SetNodeAdmin(ctx context.Context, id string, a NodeAdmin) error {
	if a == (NodeAdmin{}) {
		if err := s.nodeAdmin.Purge(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("clearing node %s: %w", id, err)
		}
		return nil
	}
	b, err := json.Marshal(a)
	if err != nil {
		return fmt.Errorf("encoding node %s: %w", id, err)
	}
	if _, err := s.nodeAdmin.Put(ctx, id, b); err != nil {
		return fmt.Errorf("recording node %s: %w", id, err)
	}
	return nil
}

// nodeAdmins returns every node's NodeAdmin.
func (s *Store) nodeAdmins(ctx context.Context) (map[string]NodeAdmin, error) {
	out := map[string]NodeAdmin{}
	lister, err := s.nodeAdmin.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	for k := range lister.Keys() {
		e, err := s.nodeAdmin.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var a NodeAdmin
		if err := json.Unmarshal(e.Value(), &a); err != nil {
			return nil, fmt.Errorf("decoding node %s: %w", k, err)
		}
		out[k] = a
	}
	return out, nil
}
