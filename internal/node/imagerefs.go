package node

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/dsec-dev/dsec/internal/noderpc"
)

// A create request carries its image's layer manifests (1.4 KB of JSON
// for a two-layer image), and encoding/json decoded them at ~25 µs a
// create, a twentieth of the function tier's whole create → exec →
// delete cycle. Creates name few distinct images, so the node decodes
// each image reference once and keeps it by its encoding; the state file
// takes the same bytes unchanged.

// createWire is a create request with its image left encoded.
type createWire struct {
	noderpc.CreateRequest
	Image json.RawMessage `json:"image"`
}

// imageRefs caches decoded image references by their encoding. Safe for
// concurrent use.
type imageRefs struct {
	mu   sync.Mutex // guards refs
	refs map[string]noderpc.ImageRef
}

// maxImageRefs bounds the cache; past it the cache starts over.
const maxImageRefs = 256

func (c *imageRefs) decode(raw json.RawMessage) (noderpc.ImageRef, error) {
	c.mu.Lock()
	ref, ok := c.refs[string(raw)]
	c.mu.Unlock()
	if ok {
		return ref, nil
	}
	if err := decode(raw, &ref); err != nil {
		return ref, err
	}
	c.mu.Lock()
	if c.refs == nil || len(c.refs) >= maxImageRefs {
		c.refs = map[string]noderpc.ImageRef{}
	}
	c.refs[string(raw)] = ref
	c.mu.Unlock()
	return ref, nil
}

// createOp is the node's handler of OpCreate.
func (a *Service) createOp(ctx context.Context, data []byte) (any, error) {
	var w createWire
	if err := decode(data, &w); err != nil {
		return nil, err
	}
	req := w.CreateRequest
	if len(w.Image) > 0 {
		ref, err := a.refs.decode(w.Image)
		if err != nil {
			return nil, err
		}
		req.Image = ref
	}
	return nil, a.createEncoded(ctx, req, w.Image)
}
