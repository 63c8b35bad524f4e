package controlplane

import (
	"cmp"
	"encoding/base64"
	"slices"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/store"
)

// owned returns the record if it exists and belongs to owner. Sandboxes
// of other owners are reported as not found, so IDs leak nothing.
func (m *Manager) owned(owner, id string) (store.SandboxRecord, error) {
	rec, _, ok := m.cache.get(id)
	if !ok || rec.Owner != owner {
		return store.SandboxRecord{}, errdefs.New(errdefs.NotFound, api.CodeSandboxNotFound, "sandbox %q not found", id)
	}
	return rec, nil
}

// running returns the record of a running sandbox of owner.
func (m *Manager) running(owner, id string) (store.SandboxRecord, error) {
	rec, err := m.owned(owner, id)
	if err != nil {
		return rec, err
	}
	if rec.State == api.StatePending && rec.Incarnation > 1 && rec.Trajectory != "" {
		return rec, notReady(&rec)
	}
	if rec.State != api.StateRunning {
		return rec, notRunning(&rec)
	}
	return rec, nil
}

// Get returns a sandbox of owner.
func (m *Manager) Get(owner, id string) (api.Sandbox, error) {
	rec, err := m.owned(owner, id)
	return rec.Sandbox, err
}

// ListOptions filter and page a list.
type ListOptions struct {
	Labels    map[string]string
	State     api.State
	Tier      string
	Limit     int
	PageToken string
}

// MaxListLimit caps a page.
const MaxListLimit = 1000

// List returns owner's sandboxes, newest first, a page at a time.
func (m *Manager) List(owner string, o ListOptions) (api.SandboxList, error) {
	if o.Limit == 0 {
		o.Limit = 100
	}
	if o.Limit < 0 || o.Limit > MaxListLimit {
		return api.SandboxList{}, errdefs.New(errdefs.Invalid, api.CodeOutOfRange, "limit must be between 1 and %d", MaxListLimit)
	}
	if o.State != "" && !sandbox.ValidState(o.State) {
		return api.SandboxList{}, errdefs.New(errdefs.Invalid, api.CodeInvalidState, "unknown state %q", o.State)
	}
	if o.Tier != "" && !sandbox.KnownTier(o.Tier) {
		return api.SandboxList{}, errdefs.New(errdefs.Invalid, api.CodeUnknownTier, "unknown tier %q", o.Tier)
	}
	after, err := decodePageToken(o.PageToken)
	if err != nil {
		return api.SandboxList{}, err
	}
	var out []api.Sandbox
	m.cache.each(func(rec *store.SandboxRecord) {
		if rec.Owner != owner || (o.State != "" && rec.State != o.State) || (o.Tier != "" && rec.Tier != o.Tier) {
			return
		}
		for k, v := range o.Labels {
			if got, ok := rec.Labels[k]; !ok || got != v {
				return
			}
		}
		if after != nil && cmpNewestFirst(rec.Sandbox, *after) <= 0 {
			return
		}
		out = append(out, rec.Sandbox)
	})
	slices.SortFunc(out, cmpNewestFirst)
	list := api.SandboxList{Sandboxes: out}
	if len(out) > o.Limit {
		list.Sandboxes = out[:o.Limit]
		list.NextPageToken = encodePageToken(out[o.Limit-1])
	}
	if list.Sandboxes == nil {
		list.Sandboxes = []api.Sandbox{}
	}
	return list, nil
}

// cmpNewestFirst orders by creation time, newest first, then by ID.
func cmpNewestFirst(a, b api.Sandbox) int {
	if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
		return c
	}
	return cmp.Compare(b.ID, a.ID)
}

// A page token is the position of the last item returned.
func encodePageToken(s api.Sandbox) string {
	return base64.RawURLEncoding.EncodeToString([]byte(s.CreatedAt.Format(time.RFC3339Nano) + "|" + s.ID))
}

func decodePageToken(tok string) (*api.Sandbox, error) {
	if tok == "" {
		return nil, nil
	}
	bad := errdefs.New(errdefs.Invalid, api.CodeInvalidPageToken, "page_token is not valid")
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return nil, bad
	}
	ts, id, ok := strings.Cut(string(b), "|")
	if !ok {
		return nil, bad
	}
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return nil, bad
	}
	return &api.Sandbox{ID: id, CreatedAt: t}, nil
}

// ImageInUse reports whether a live sandbox runs image id.
func (m *Manager) ImageInUse(id string) bool {
	used := false
	m.cache.each(func(rec *store.SandboxRecord) {
		used = used || (rec.ImageID == id && sandbox.Live(rec.State))
	})
	return used
}

// LayerInUse reports whether a live sandbox runs an image with layer id.
func (m *Manager) LayerInUse(id string) bool {
	used := false
	m.cache.each(func(rec *store.SandboxRecord) {
		if !used && sandbox.Live(rec.State) {
			used = slices.Contains(rec.Layers, id)
		}
	})
	return used
}
