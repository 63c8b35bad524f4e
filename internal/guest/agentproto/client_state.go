package agentproto

import (
	"context"
	"io"
	"slices"
)

// The writable state, for snapshots: the node freezes the guest's upper
// file system, lists it, reads the files that changed and thaws it. The
// agent is hostile here as everywhere: the listing and the content are
// checked by the node's capture (sandbox.CaptureOptions.Listing).

// HasCap reports whether the agent announced capability name in its
// hello (false before Hello).
func (c *Client) HasCap(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.hello, name)
}

// Freeze syncs and freezes the file system of the guest's writable layer
// for at most args.TimeoutMS (MaxFreeze at most), on an agent that
// announced CapState.
func (c *Client) Freeze(ctx context.Context, args FreezeArgs) error {
	return c.unary(ctx, OpFreeze, args, nil)
}

// Thaw thaws the writable layer's file system. It fails with
// api.CodeStateFreezeExpired when the agent thawed it by itself since
// Freeze (the freeze outlived its timeout).
func (c *Client) Thaw(ctx context.Context) error {
	return c.unary(ctx, OpThaw, nil, nil)
}

// StateList lists the writable layer, parents before children, at most
// MaxStateEntries.
func (c *Client) StateList(ctx context.Context) ([]StateEntry, error) {
	var out []StateEntry
	err := c.listingN(ctx, OpStateList, nil, MaxStateEntries, func(line []byte) error {
		var e StateEntry
		if err := decodeJSON(line, &e); err != nil {
			return err
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// StateRead streams the content of a regular file of the writable layer
// by its listed path. ctx bounds the whole read; the agent must make
// progress within DefaultCallTimeout. The caller checks the length.
func (c *Client) StateRead(ctx context.Context, path string) (io.ReadCloser, error) {
	ctx, cancel := context.WithCancel(ctx)
	st, err := c.s.open(ctx, OpStateRead, StateReadArgs{Path: path})
	if err != nil {
		cancel()
		return nil, err
	}
	return &fileReader{c: c, st: st, ctx: ctx, cancel: cancel}, nil
}
