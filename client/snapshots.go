package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/dsec-dev/dsec/api"
)

// Extra time on top of the client's timeout for calls that store or start
// a lot: a snapshot writes the sandbox's whole writable layer, a fork
// starts count sandboxes, a resume replays a rollout.
const (
	snapshotWait = 2 * time.Minute
	forkWait     = 5 * time.Minute
	resumeWait   = 10 * time.Minute
)

var errEmptySnapshotID = errors.New("snapshot ID is empty")

// Snapshot stores the sandbox id's writable state as a layer (POST
// …/snapshot). The sandbox keeps running; a sandbox that records a
// trajectory logs the snapshot as a step. CreateSandbox with FromSnapshot
// starts from it, and a resume starts from the latest one.
func (c *Client) Snapshot(ctx context.Context, id string) (api.Snapshot, error) {
	p, err := sandboxPath(id, "/snapshot")
	if err != nil {
		return api.Snapshot{}, err
	}
	var s api.Snapshot
	err = c.call(ctx, http.MethodPost, p, nil, &s, snapshotWait)
	return s, err
}

// Fork starts req.Count sandboxes from the sandbox id's current state,
// through one snapshot, and returns them in order (POST …/fork). The
// parent keeps running. All or nothing: if one child cannot be made the
// server destroys the others. Like a create, a fork refused with 429, or
// 503 with Retry-After, made nothing and is retried; any other failure
// is returned as it is.
func (c *Client) Fork(ctx context.Context, id string, req api.ForkRequest) (api.ForkResult, error) {
	p, err := sandboxPath(id, "/fork")
	if err != nil {
		return api.ForkResult{}, err
	}
	var r api.ForkResult
	err = c.call(ctx, http.MethodPost, p, req, &r, forkWait)
	return r, err
}

// snapshotPath returns /v1/snapshots/{id}.
func snapshotPath(id string) (string, error) {
	if id == "" {
		return "", errEmptySnapshotID
	}
	return "/v1/snapshots/" + url.PathEscape(id), nil
}

// GetSnapshot returns the snapshot id; an unknown one is ErrNotFound
// (code snapshot_not_found).
func (c *Client) GetSnapshot(ctx context.Context, id string) (api.Snapshot, error) {
	p, err := snapshotPath(id)
	if err != nil {
		return api.Snapshot{}, err
	}
	var s api.Snapshot
	err = c.call(ctx, http.MethodGet, p, nil, &s, 0)
	return s, err
}

// DeleteSnapshot deletes the snapshot id. Its layers stay while a sandbox
// or a trajectory uses them.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	p, err := snapshotPath(id)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, 0)
}
