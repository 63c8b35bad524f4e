package vmtier

import (
	"context"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// TestSnapshotTmpfsUpperRefused: a VM whose upper is a tmpfs in its
// memory (Options.Upper UpperTmpfs) cannot be frozen, so its snapshot is
// refused with unsupported_on_tier, saying why and what to set.
func TestSnapshotTmpfsUpperRefused(t *testing.T) {
	sb := &Sandbox{id: "mvm-tmpfs", rt: &Runtime{opt: Options{Upper: UpperTmpfs}}, upperDisk: false}
	_, _, err := sb.CaptureState(context.Background(), t.TempDir(), nil)
	if errdefs.CodeOf(err) != api.CodeUnsupportedOnTier || !strings.Contains(err.Error(), "tmpfs") || !strings.Contains(err.Error(), `upper = "disk"`) {
		t.Fatalf("snapshot of a tmpfs-upper VM: %v, want unsupported_on_tier naming the tmpfs and the upper disk", err)
	}
}
