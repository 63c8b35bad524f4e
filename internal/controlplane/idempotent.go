package controlplane

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"regexp"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
)

// requestID is what a create's RequestID (its idempotency key) may be.
var requestID = regexp.MustCompile(`^[A-Za-z0-9._:/-]{1,128}$`)

// awaitPoll is how often a repeated create looks at the sandbox the
// first is making.
const awaitPoll = 20 * time.Millisecond

// createOnce is Create for a request with a RequestID: the first create
// with the key claims it for the sandbox ID it will make (store, a day);
// a repeat (a client's retry after a lost answer, or the same request
// through another API server) gets that sandbox, once it is no longer
// pending, instead of making another. A create that made nothing (it
// failed) releases the key, so that a retry makes the sandbox. The key is
// the owner's: another owner's same RequestID is another key.
func (m *Manager) createOnce(ctx context.Context, owner string, req api.CreateSandboxRequest) (api.Sandbox, error) {
	if !requestID.MatchString(req.RequestID) {
		return api.Sandbox{}, errdefs.New(errdefs.Invalid, api.CodeInvalidRequestID, "request_id must be 1–128 letters, digits or -_.:/")
	}
	key, digest := requestKey(owner, req)
	ctx, cancel := context.WithTimeout(ctx, 2*createDeadline)
	defer cancel()
	for {
		id := newID()
		got, claimed, err := m.st.ClaimRequest(ctx, key, store.RequestRecord{Sandbox: id, Digest: digest})
		if err != nil {
			return api.Sandbox{}, err
		}
		if claimed {
			rec, err := m.create(ctx, owner, req, createOpts{id: id})
			if err != nil {
				if _, gerr := m.owned(owner, id); gerr != nil {
					// Nothing was kept: the key goes, for a retry.
					if rerr := m.st.ReleaseRequest(context.WithoutCancel(ctx), key); rerr != nil {
						m.log.Warn("releasing a failed create's request_id", "request_id", req.RequestID, "err", rerr)
					}
				}
			}
			return rec.Sandbox, err
		}
		if got.Digest != digest {
			return api.Sandbox{}, errdefs.New(errdefs.Conflict, api.CodeRequestIDReused, "request_id %q was used for another create", req.RequestID)
		}
		sb, err := m.awaitCreate(ctx, owner, got.Sandbox)
		if errors.Is(err, errRequestReleased) {
			continue // the first create made nothing: make it now
		}
		return sb, err
	}
}

// errRequestReleased: the create that held a key made nothing.
var errRequestReleased = errors.New("the first create with this request_id made nothing")

// awaitCreate waits until sandbox id, which another create with the same
// key is making, is no longer pending, and returns it. If no record of it
// shows for a second, it says so: the caller claims the key again, which
// succeeds if that create made nothing and released it.
func (m *Manager) awaitCreate(ctx context.Context, owner, id string) (api.Sandbox, error) {
	t := time.NewTicker(awaitPoll)
	defer t.Stop()
	missing := 0
	for {
		rec, err := m.owned(owner, id)
		switch {
		case err == nil && rec.State != api.StatePending:
			return rec.Sandbox, nil
		case err == nil:
			missing = 0
		case errdefs.ClassOf(err) == errdefs.NotFound:
			// Not made yet, or made nothing: after a while without a
			// record, the key is claimed again (if its create released it,
			// the claim succeeds and makes the sandbox; if not, it waits on).
			if missing++; missing > int(time.Second/awaitPoll) {
				return api.Sandbox{}, errRequestReleased
			}
		default:
			return api.Sandbox{}, err
		}
		select {
		case <-ctx.Done():
			return api.Sandbox{}, errdefs.Wrap(errdefs.DeadlineExceeded, api.CodeDeadlineExceeded, ctx.Err(), "waiting for the create with the same request_id")
		case <-t.C:
		}
	}
}

// requestKey is the store key of owner's RequestID, and the digest of
// the request it names (without the RequestID).
func requestKey(owner string, req api.CreateSandboxRequest) (key, digest string) {
	k := sha256.Sum256([]byte(owner + "\x00" + req.RequestID))
	req.RequestID = ""
	b, _ := json.Marshal(req) // a request that was decoded encodes
	d := sha256.Sum256(b)
	return hex.EncodeToString(k[:]), hex.EncodeToString(d[:])
}
