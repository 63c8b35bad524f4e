package noderpc

import (
	"context"
	"time"
)

// SnapshotTimeout bounds a snapshot whose context has no deadline: it
// copies the writable state and builds and uploads a layer.
const SnapshotTimeout = 10 * time.Minute

// Snapshot stores sandbox id's writable state as a layer in the node's
// blob store (see SnapshotReply).
func (c *Client) Snapshot(ctx context.Context, node, id string, req SnapshotRequest) (SnapshotReply, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, SnapshotTimeout)
		defer cancel()
	}
	req.ID = id
	var r SnapshotReply
	err := c.request(ctx, node, OpSnapshot, req, &r)
	return r, err
}

// Stored waits until the layer of a Background snapshot of sandbox id is
// in the blob store (see StoredRequest).
func (c *Client) Stored(ctx context.Context, node, id string, layer LayerRef) (StoredReply, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, SnapshotTimeout)
		defer cancel()
	}
	var r StoredReply
	err := c.request(ctx, node, OpStored, StoredRequest{ID: id, Layer: layer}, &r)
	return r, err
}
