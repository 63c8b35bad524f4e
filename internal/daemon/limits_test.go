package daemon

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/testenv"
	"github.com/dsec-dev/dsec/internal/wasmtools"
)

func TestPerTokenLimits(t *testing.T) {
	u := startUp(t, "", func(c *config.Config) {
		c.Limits.MaxSandboxesPerToken = 3
		c.Limits.CreatesPerSecond = 1000
		c.Limits.CreateBurst = 1000
	})
	ctx := context.Background()
	var ids []string
	for i := 0; i < 3; i++ {
		sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	_, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.StatusCode != 429 || ce.Code != "too_many_sandboxes" || ce.RetryAfter <= 0 {
		t.Fatalf("fourth create: %v, want 429 too_many_sandboxes with Retry-After", err)
	}
	// Deleting one frees a slot.
	if err := u.c.DeleteSandbox(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{}); err != nil {
		t.Errorf("create after a delete: %v", err)
	}
}

func TestCreateRateLimit(t *testing.T) {
	u := startUp(t, "", func(c *config.Config) {
		c.Limits.CreatesPerSecond = 2
		c.Limits.CreateBurst = 2
	})
	ctx := context.Background()
	var limited *client.Error
	for i := 0; i < 6 && limited == nil; i++ {
		_, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{})
		var ce *client.Error
		if errors.As(err, &ce) && ce.StatusCode == 429 {
			limited = ce
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if limited == nil || limited.Code != "rate_limited" || limited.RetryAfter <= 0 || limited.RetryAfter > 2*time.Second {
		t.Fatalf("rate limit not enforced: %+v", limited)
	}
	time.Sleep(limited.RetryAfter)
	if _, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{}); err != nil {
		t.Errorf("create after Retry-After: %v", err)
	}
}

func TestHostileModulesThroughTheAPI(t *testing.T) {
	u := startUp(t, "", nil)
	ctx := context.Background()
	sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{MemoryMB: 64})
	if err != nil {
		t.Fatal(err)
	}
	run := func(req api.ExecRequest) *api.ExecResult {
		t.Helper()
		res, err := u.c.Exec(ctx, sb.ID, req)
		if err != nil {
			t.Fatalf("exec %v: %v", req.Cmd, err)
		}
		return res
	}
	if res := run(api.ExecRequest{Cmd: []string{"trap"}}); res.ExitCode != -1 || !strings.Contains(res.Error, "trap") {
		t.Errorf("trap: %+v", res)
	}
	start := time.Now()
	if res := run(api.ExecRequest{Cmd: []string{"loop"}, TimeoutS: 1}); !res.TimedOut || res.ExitCode != -1 {
		t.Errorf("loop: %+v", res)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("loop stopped after %v", d)
	}
	if res := run(api.ExecRequest{Cmd: []string{"alloc", "512"}}); res.ExitCode == 0 {
		t.Errorf("alloc 512 MiB under 64 MiB succeeded: %+v", res)
	}
	res := run(api.ExecRequest{Cmd: []string{"yes"}, TimeoutS: 2})
	if len(res.Stdout) != 4<<20 || !res.StdoutTruncated {
		t.Errorf("flood: %d bytes of stdout, truncated=%v; want the 4 MiB default cap", len(res.Stdout), res.StdoutTruncated)
	}
	if res := run(api.ExecRequest{Cmd: []string{"echo", "still", "fine"}}); res.Stdout != "still fine\n" {
		t.Errorf("after the hostile calls: %+v", res)
	}
}

func TestShutdownFinishesInFlightRequests(t *testing.T) {
	u := startUp(t, "", nil)
	ctx := context.Background()
	sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// The in-flight request is the sleep, not the tool's first compile
	// (tens of seconds on a loaded machine under the race detector, which
	// may outlast the API's grace).
	if _, err := u.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "0"}}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		res *api.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := u.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "3"}, TimeoutS: 10})
		done <- result{res, err}
	}()
	// The exec is running by then, on the node: a request still on its
	// way to the node when the node stops is not in flight at the API
	// only, and waits out the API's grace (seen at 300 ms on a loaded
	// machine, with the race detector).
	time.Sleep(1500 * time.Millisecond)
	u.stop()
	r := testenv.Recv(t, done, time.Minute, "the in-flight exec to finish")
	if r.err != nil || r.res.ExitCode != 0 || r.res.TimedOut {
		t.Errorf("exec in flight during shutdown: %+v, %v", r.res, r.err)
	}
}

func TestDirImage(t *testing.T) {
	u := startUp(t, "", nil)
	ctx := context.Background()
	// An operator's image: the built-in tools under other names.
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "bin"), 0o755)
	src, err := os.ReadFile(filepath.Join(wasmtools.ForTest(t), "bin", "echo.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "bin", "echo.wasm"), src, 0o644)
	os.WriteFile(filepath.Join(dir, "bin", "greet.wasm"), src, 0o644)
	img, err := u.c.AddDirImage(ctx, api.AddDirImageRequest{Name: "team/tools:v1", Path: dir, Tiers: []string{"function"}})
	if err != nil || img.Name != "team/tools:v1" {
		t.Fatalf("AddDirImage = %+v, %v", img, err)
	}
	imgs, err := u.c.Images(ctx)
	if err != nil || !slices.ContainsFunc(imgs.Images, func(i api.Image) bool { return i.Name == "team/tools:v1" && i.Source == "dir:"+dir }) {
		t.Errorf("Images = %+v, %v", imgs, err)
	}
	sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "team/tools:v1"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := u.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "from", "a", "dir", "image"}})
	if err != nil || res.Stdout != "from a dir image\n" {
		t.Errorf("exec in a dir image: %+v, %v", res, err)
	}
	if _, err := u.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"cat"}}); !client.IsNotFound(err) {
		t.Errorf("a tool the image lacks: %v, want 404", err)
	}
	if _, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: "container", Image: "team/tools:v1"}); !client.IsInvalid(err) {
		t.Errorf("function image on the container tier: %v, want 400", err)
	}
	if _, err := u.c.AddDirImage(ctx, api.AddDirImageRequest{Name: "x", Path: "relative"}); !client.IsInvalid(err) {
		t.Errorf("relative dir: %v", err)
	}
}

// TestDeleteDuringStalledUpload deletes a sandbox while an upload to it is
// stuck half-way: the delete must not wait for the uploader.
func TestDeleteDuringStalledUpload(t *testing.T) {
	u := startUp(t, "", nil)
	ctx := context.Background()
	sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	uploadDone := make(chan error, 1)
	go func() {
		_, err := u.c.WriteFile(ctx, sb.ID, "stalled.bin", pr, client.WriteOptions{})
		uploadDone <- err
	}()
	// More than one chunk, then nothing.
	if _, err := pw.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	if err := u.c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("delete waited %v for a stalled upload", d)
	}
	pw.CloseWithError(errors.New("giving up"))
	if err := testenv.Recv(t, uploadDone, time.Minute, "the stalled upload to end"); err == nil {
		t.Error("the stalled upload succeeded after its sandbox was deleted")
	}
}
