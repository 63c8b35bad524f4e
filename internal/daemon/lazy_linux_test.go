package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/client/tardir"
	"github.com/dsec-dev/dsec/internal/auth"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/image/chunks"
	"github.com/dsec-dev/dsec/internal/image/profiles"
	"github.com/dsec-dev/dsec/internal/natsbus"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestLazyImagesEndToEnd runs `dsec up` with images loaded on demand: a
// workspace layer uploaded through the API is cached on the node as its
// metadata and chunk index only, and a function sandbox reads its files
// (a small one and a 5 MiB one, checked by digest) through the lazy
// blob's FUSE file. The harness checks that the stop leaves no mount,
// the FUSE one included.
func TestLazyImagesEndToEnd(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("the kernel has no FUSE device: %v", err)
	}
	dir := t.TempDir()
	u := startUp(t, dir, func(c *config.Config) { c.Images.Lazy, c.NATS.Listen = true, "127.0.0.1:0" })
	ctx := context.Background()

	src := t.TempDir()
	big := testenv.RandBytes(5, 5<<20)
	if err := os.MkdirAll(filepath.Join(src, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "data", "hello.txt"), []byte("loaded on demand\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "data", "big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	var tarBuf bytes.Buffer
	if err := tardir.Write(src, &tarBuf); err != nil {
		t.Fatal(err)
	}
	ws, err := u.c.ImportLayer(ctx, client.KindTar, &tarBuf, "workspace/lazy:v1")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Layers: []api.ImageLayer{{Role: "workspace", ID: ws.ID}, {Role: "toolkit", ID: "toolkit/wasm-tools"}}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := u.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"cat", "/data/hello.txt"}})
	if err != nil || res.Stdout != "loaded on demand\n" {
		t.Fatalf("reading a small file: %+v, %v", res, err)
	}
	sum := sha256.Sum256(big)
	res, err = u.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sha256sum", "/data/big.bin"}})
	if err != nil || !strings.HasPrefix(res.Stdout, hex.EncodeToString(sum[:])) {
		t.Fatalf("the 5 MiB file's digest: %+v, %v; want %x", res, err, sum)
	}

	// The node holds the layer's metadata and index, not its data.
	files := filepath.Join(dir, "layers", "files", strings.TrimPrefix(ws.ID, "sha256:"))
	for name, want := range map[string]bool{"meta.erofs": true, "chunks.json": true, "data.blob": false} {
		if _, err := os.Stat(filepath.Join(files, name)); (err == nil) != want {
			t.Errorf("%s on the node: %v, want present %v", name, err, want)
		}
	}
	ms, err := sys.MountsUnder(filepath.Join(dir, "node", "lazy"))
	if err != nil || len(ms) != 1 {
		t.Errorf("the lazy blob mount: %q, %v", ms, err)
	}
	// The chunks the sandbox read are the layer's access profile, kept in
	// the shared bucket once its reads pause, for every node's prefetch.
	natsToken, _, err := auth.LoadOrCreateAt(filepath.Join(dir, "nats.token"))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := natsbus.Dial(ctx, u.info.NATSURL, natsToken, "test-profiles")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	prof, err := profiles.Open(ctx, nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := os.ReadFile(filepath.Join(files, "chunks.json"))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := chunks.Parse(ib)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the layer's access profile to be kept", func() bool {
		order, err := prof.Profile(ctx, idx.Digest)
		return err == nil && len(order) >= 5 // the 5 MiB file, in 1 MiB chunks
	})
	if err := u.c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	u.stop()
	if ms, err := sys.MountsUnder(dir); err != nil || len(ms) != 0 {
		t.Errorf("after the stop: mounts %q, %v", ms, err)
	}
}
