package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	wire "github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/builtin"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image"
	"github.com/dsec-dev/dsec/internal/store"
)

// BuiltinFunctionImage is the function tier's default image.
const BuiltinFunctionImage = builtin.FunctionImage

// installBuiltinImages puts the built-in images on this node and registers
// them. The record names a "builtin:" source that every node resolves to
// its own copy, so nodes need not share a data directory layout.
func (d *daemon) installBuiltinImages(ctx context.Context, images *image.Registry) error {
	_, digest, err := builtin.InstallFunctionImage(ctx, d.cfg.DataDir)
	if err != nil {
		return err
	}
	name, _ := image.Normalize(builtin.FunctionImage)
	cur, err := images.Resolve(ctx, name)
	switch {
	case err == nil && cur.ID == digest:
		return nil
	case err != nil && !errors.Is(err, errdefs.NotFound):
		return err
	}
	rec := store.ImageRecord{ID: digest, Name: name, Source: builtin.SourcePrefix + builtin.FunctionImage,
		Tiers: []string{wire.TierFunction}, Created: time.Now().UTC().Format(time.RFC3339Nano)}
	if err := d.st.PutImage(ctx, rec); err != nil {
		return fmt.Errorf("registering %s: %w", name, err)
	}
	d.log.Info("registered built-in image", "image", name, "id", digest)
	return nil
}
