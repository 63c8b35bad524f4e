package function

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

var nextTestID atomic.Int64

// create makes a sandbox of the default image; edit may change its spec.
// The sandbox is destroyed with the test.
func create(t *testing.T, rt *Runtime, edit func(*sandbox.Spec)) *Sandbox {
	t.Helper()
	spec := sandbox.Spec{
		ID:       fmt.Sprintf("t%d", nextTestID.Add(1)),
		Tier:     Tier,
		Image:    testImage(t),
		CPU:      1,
		MemoryMB: 256,
		DiskMB:   64,
	}
	if edit != nil {
		edit(&spec)
	}
	sb, err := rt.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return sb.(*Sandbox)
}

// run executes argv (with stdin) and fails the test on an error.
func run(t *testing.T, sb *Sandbox, stdin string, argv ...string) api.ExecResult {
	t.Helper()
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: argv, Stdin: stdin, TimeoutS: 30}})
	if err != nil {
		t.Fatalf("Exec(%q): %v", argv, err)
	}
	return res
}

// installTool copies the dsectools module to /workspace/<name>.wasm, for
// the test tools the image does not install, and returns that path.
func installTool(t *testing.T, sb *Sandbox, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testImage(t).Root, "bin", "echo.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	p := "/workspace/" + name + ".wasm"
	if _, err := sb.Files().Write(context.Background(), p, bytes.NewReader(b), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

// mounts returns the mount points under dir.
func mounts(t testing.TB, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Skipf("no /proc/self/mounts: %v", err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], dir) {
			out = append(out, f[1])
		}
	}
	return out
}

// needTmpfs skips tests of the tmpfs workspace when it cannot be mounted.
func needTmpfs(t *testing.T, sb *Sandbox) {
	t.Helper()
	if !sb.tmpfs {
		t.Skip("workspaces are plain directories here (not root, or not Linux): the disk cap is not enforced")
	}
}
