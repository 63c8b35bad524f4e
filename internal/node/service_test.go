package node

import (
	"context"
	"fmt"
	"github.com/dsec-dev/dsec/internal/testenv"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// TestCreateRefusals: creates the node refuses, with the class the
// control plane acts on, leave nothing on the node and, when refused
// before the runtime, do not reach it.
func TestCreateRefusals(t *testing.T) {
	tests := []struct {
		name    string
		req     func(t *testing.T) noderpc.CreateRequest
		runtime func(rt *fakeRuntime)
		layers  bool
		class   errdefs.Class
		code    string
		reached bool // the runtime's Create was called
	}{
		{name: "unknown tier", req: func(t *testing.T) noderpc.CreateRequest {
			return noderpc.CreateRequest{ID: "sb-1", Tier: "quantum", Image: dirImage(t)}
		}, class: errdefs.Invalid, code: api.CodeUnknownTier},
		{name: "tier not on this node", req: func(t *testing.T) noderpc.CreateRequest {
			return noderpc.CreateRequest{ID: "sb-1", Tier: api.TierVM, Image: dirImage(t)}
		}, class: errdefs.Unsupported, code: api.CodeTierUnavailable},
		{name: "image source unknown", req: func(t *testing.T) noderpc.CreateRequest {
			return noderpc.CreateRequest{ID: "sb-1", Tier: api.TierContainer, Image: noderpc.ImageRef{Name: "x", Source: "s3://x"}}
		}, class: errdefs.Unsupported, code: api.CodeImageSourceUnsupported},
		{name: "image dir relative", req: func(t *testing.T) noderpc.CreateRequest {
			return noderpc.CreateRequest{ID: "sb-1", Tier: api.TierContainer, Image: noderpc.ImageRef{Name: "x", Source: "dir:rel"}}
		}, class: errdefs.Invalid, code: api.CodeInvalidImage},
		{name: "image dir missing", req: func(t *testing.T) noderpc.CreateRequest {
			return noderpc.CreateRequest{ID: "sb-1", Tier: api.TierContainer, Image: noderpc.ImageRef{Name: "x", Source: "dir:" + filepath.Join(t.TempDir(), "gone")}}
		}, class: errdefs.NotFound, code: api.CodeImageMissingOnNode},
		{name: "layers without a cache", req: func(t *testing.T) noderpc.CreateRequest {
			return noderpc.CreateRequest{ID: "sb-1", Tier: api.TierContainer, Image: layeredImage("L1")}
		}, class: errdefs.Unsupported, code: api.CodeNoLayerCache},
		{name: "runtime fails", req: func(t *testing.T) noderpc.CreateRequest {
			return noderpc.CreateRequest{ID: "sb-1", Tier: api.TierContainer, Image: dirImage(t)}
		}, runtime: func(rt *fakeRuntime) {
			rt.onCreate = func(sandbox.Spec) error { return errdefs.New(errdefs.Internal, api.CodeSandboxStartFailed, "no") }
		}, class: errdefs.Internal, code: api.CodeSandboxStartFailed, reached: true},
		{name: "runtime out of descriptors", req: func(t *testing.T) noderpc.CreateRequest {
			return noderpc.CreateRequest{ID: "sb-1", Tier: api.TierContainer, Image: dirImage(t)}
		}, runtime: func(rt *fakeRuntime) {
			rt.onCreate = func(sandbox.Spec) error { return fmt.Errorf("starting: %w", syscall.EMFILE) }
		}, class: errdefs.Unavailable, code: CodeResourcesExhausted, reached: true},
		{name: "runtime fails with layers", layers: true, req: func(t *testing.T) noderpc.CreateRequest {
			return noderpc.CreateRequest{ID: "sb-1", Tier: api.TierContainer, Image: layeredImage("L1")}
		}, runtime: func(rt *fakeRuntime) {
			rt.onCreate = func(sandbox.Spec) error { return errdefs.New(errdefs.Internal, api.CodeSandboxStartFailed, "no") }
		}, class: errdefs.Internal, code: api.CodeSandboxStartFailed, reached: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := newFakeRuntime(api.TierContainer)
			if tt.runtime != nil {
				tt.runtime(rt)
			}
			var opt Options
			var layers *fakeLayers
			if tt.layers {
				plainState(t)
				layers = newFakeLayers()
				opt.Layers, opt.StateDir = layers, t.TempDir()
			}
			a := newTestService(t, opt, rt)
			err := a.Create(context.Background(), tt.req(t))
			wantCode(t, err, tt.class, tt.code)
			if reached := rt.creates() > 0; reached != tt.reached {
				t.Errorf("runtime reached: %v", reached)
			}
			a.mu.Lock()
			n := len(a.sandboxes)
			a.mu.Unlock()
			if n != 0 {
				t.Errorf("%d sandboxes left on the node", n)
			}
			if layers != nil {
				if layers.held("L1") != 0 {
					t.Errorf("image view still held %d times", layers.held("L1"))
				}
				if st := a.state.all(); len(st) != 0 {
					t.Errorf("state left: %v", st)
				}
			}
		})
	}
}

// TestCreateAndDestroy: a created sandbox is listed and counted, holds
// its image view and state until destroyed; a second create of the same
// ID is refused; destroying an unknown sandbox succeeds.
func TestCreateAndDestroy(t *testing.T) {
	plainState(t)
	rt := newFakeRuntime(api.TierContainer)
	layers := newFakeLayers()
	a := newTestService(t, Options{Layers: layers, StateDir: t.TempDir()}, rt)
	ctx := context.Background()
	req := noderpc.CreateRequest{ID: "sb-1", Tier: api.TierContainer, Image: layeredImage("L1"), CPU: 2, MemoryMB: 512, Env: map[string]string{"A": "1"}}
	if err := a.Create(ctx, req); err != nil {
		t.Fatal(err)
	}
	spec := rt.specs[0]
	if spec.ID != "sb-1" || spec.Image.Root != "/views/L1" || spec.CPU != 2 || spec.MemoryMB != 512 || spec.Env["A"] != "1" {
		t.Errorf("runtime spec %+v", spec)
	}
	if !listed(a)["sb-1"] || layers.held("L1") != 1 || len(a.state.all()) != 1 {
		t.Fatalf("listed %v, view held %d, state %v", listed(a), layers.held("L1"), a.state.all())
	}
	if n := a.Info(ctx); n.Usage.Sandboxes != 1 || n.ID != "n1" || len(n.Tiers) != 1 || n.Tiers[0].Name != api.TierContainer {
		t.Errorf("info %+v", n)
	}
	wantCode(t, a.Create(ctx, req), errdefs.Conflict, api.CodeSandboxExists)
	if rt.creates() != 1 {
		t.Errorf("a duplicate reached the runtime")
	}
	if err := a.Destroy(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	if listed(a)["sb-1"] || layers.held("L1") != 0 || len(a.state.all()) != 0 || rt.sandbox("sb-1").destroyed() != 1 {
		t.Errorf("after destroy: listed %v, view held %d, state %v, destroys %d", listed(a), layers.held("L1"), a.state.all(), rt.sandbox("sb-1").destroyed())
	}
	if err := a.Destroy(ctx, "sb-1"); err != nil {
		t.Errorf("destroying it again: %v", err)
	}
	if _, _, err := a.lookup("sb-1"); errdefs.ClassOf(err) != errdefs.NotFound {
		t.Errorf("lookup after destroy: %v", err)
	}
}

// TestCreateOwnRoot: a tier that builds its own roots gets the layers,
// and the node holds no view or state for it.
func TestCreateOwnRoot(t *testing.T) {
	plainState(t)
	rt := newFakeRuntime(api.TierMicroVM)
	rt.caps.OwnRoot = true
	layers := newFakeLayers()
	a := newTestService(t, Options{Layers: layers, StateDir: t.TempDir()}, rt)
	if err := a.Create(context.Background(), noderpc.CreateRequest{ID: "sb-1", Tier: api.TierMicroVM, Image: layeredImage("L1")}); err != nil {
		t.Fatal(err)
	}
	if spec := rt.specs[0]; spec.Image.Root != "" || len(spec.Image.Layers) != 1 || spec.Image.Layers[0].ID != "L1" {
		t.Errorf("spec image %+v", spec.Image)
	}
	if layers.held("L1") != 0 || len(a.state.all()) != 0 {
		t.Errorf("view held %d, state %v", layers.held("L1"), a.state.all())
	}
}

// TestNodeFull: past MaxSandboxes a create is refused as retryable, and
// a sandbox being created counts.
func TestNodeFull(t *testing.T) {
	rt := newFakeRuntime(api.TierContainer)
	a := newTestService(t, Options{MaxSandboxes: 1}, rt)
	if err := a.Create(context.Background(), noderpc.CreateRequest{ID: "sb-1", Tier: api.TierContainer, Image: dirImage(t)}); err != nil {
		t.Fatal(err)
	}
	err := a.Create(context.Background(), noderpc.CreateRequest{ID: "sb-2", Tier: api.TierContainer, Image: dirImage(t)})
	wantCode(t, err, errdefs.Unavailable, api.CodeNodeFull)
	if rt.creates() != 1 {
		t.Errorf("the refused create reached the runtime")
	}
}

// TestCreateWaitsForAdmission: a create that finds the tier's start
// slots taken for longer than the wait is refused as overloaded before
// the runtime sees it; another tier is not held up.
func TestCreateWaitsForAdmission(t *testing.T) {
	ct, fn := newFakeRuntime(api.TierContainer), newFakeRuntime(api.TierFunction)
	started, proceed := make(chan struct{}), make(chan struct{})
	ct.onCreate = func(sandbox.Spec) error {
		started <- struct{}{}
		hold(proceed)
		return nil
	}
	a := newTestService(t, Options{Starts: StartLimits{Slots: 1, Queue: 10, Wait: 50 * time.Millisecond}}, ct, fn)
	done := make(chan error)
	go func() {
		done <- a.Create(context.Background(), noderpc.CreateRequest{ID: "sb-1", Tier: api.TierContainer, Image: dirImage(t)})
	}()
	testenv.Recv(t, started, wait, "the first create to start")
	err := a.Create(context.Background(), noderpc.CreateRequest{ID: "sb-2", Tier: api.TierContainer, Image: dirImage(t)})
	wantCode(t, err, errdefs.RateLimited, CodeOverloaded)
	if errdefs.RetryAfterOf(err) <= 0 {
		t.Error("no retry hint")
	}
	if err := a.Create(context.Background(), noderpc.CreateRequest{ID: "sb-3", Tier: api.TierFunction, Image: dirImage(t)}); err != nil {
		t.Errorf("another tier: %v", err)
	}
	close(proceed)
	if err := testenv.Recv(t, done, wait, "the first create"); err != nil {
		t.Fatal(err)
	}
	if ct.creates() != 1 || !listed(a)["sb-1"] || listed(a)["sb-2"] {
		t.Errorf("runtime creates %d, listed %v", ct.creates(), listed(a))
	}
}

// TestDestroyDuringCreate: a destroy that comes while the runtime still
// creates the sandbox succeeds at once; the create then fails with
// sandbox_deleted and the node destroys what the runtime made.
func TestDestroyDuringCreate(t *testing.T) {
	plainState(t)
	rt := newFakeRuntime(api.TierContainer)
	layers := newFakeLayers()
	started, proceed := make(chan struct{}), make(chan struct{})
	rt.onCreate = func(sandbox.Spec) error {
		close(started)
		hold(proceed)
		return nil
	}
	a := newTestService(t, Options{Layers: layers, StateDir: t.TempDir()}, rt)
	done := make(chan error)
	go func() {
		done <- a.Create(context.Background(), noderpc.CreateRequest{ID: "sb-1", Tier: api.TierContainer, Image: layeredImage("L1")})
	}()
	testenv.Recv(t, started, wait, "the create to start")
	if listed(a)["sb-1"] {
		t.Error("a sandbox being created is listed")
	}
	if err := a.Destroy(context.Background(), "sb-1"); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	wantCode(t, testenv.Recv(t, done, wait, "the create"), errdefs.Conflict, api.CodeSandboxDeleted)
	waitFor(t, "the made sandbox to be destroyed and its view released", func() bool {
		sb := rt.sandbox("sb-1")
		return sb != nil && sb.destroyed() == 1 && layers.held("L1") == 0 && len(a.state.all()) == 0
	})
	if listed(a)["sb-1"] {
		t.Error("still listed")
	}
}

// TestDestroyFailures: a destroy the sandbox cannot finish yet
// (Unavailable) keeps it for the control plane's retry; any other
// failure forgets it, keeping its image view (its mounts may still use
// it).
func TestDestroyFailures(t *testing.T) {
	plainState(t)
	rt := newFakeRuntime(api.TierContainer)
	layers := newFakeLayers()
	a := newTestService(t, Options{Layers: layers, StateDir: t.TempDir()}, rt)
	ctx := context.Background()
	for _, id := range []string{"sb-busy", "sb-broken"} {
		if err := a.Create(ctx, noderpc.CreateRequest{ID: id, Tier: api.TierContainer, Image: layeredImage(id)}); err != nil {
			t.Fatal(err)
		}
	}
	rt.sandbox("sb-busy").destroyErr = errdefs.New(errdefs.Unavailable, api.CodeDestroyIncomplete, "not yet")
	rt.sandbox("sb-broken").destroyErr = errdefs.New(errdefs.Internal, api.CodeDestroyFailed, "no")

	wantCode(t, a.Destroy(ctx, "sb-busy"), errdefs.Unavailable, api.CodeDestroyIncomplete)
	if !listed(a)["sb-busy"] || layers.held("sb-busy") != 1 {
		t.Errorf("busy: listed %v, view held %d", listed(a), layers.held("sb-busy"))
	}
	rt.sandbox("sb-busy").destroyErr = nil
	if err := a.Destroy(ctx, "sb-busy"); err != nil {
		t.Fatal(err)
	}
	if listed(a)["sb-busy"] || layers.held("sb-busy") != 0 {
		t.Errorf("busy, retried: listed %v, view held %d", listed(a), layers.held("sb-busy"))
	}

	wantCode(t, a.Destroy(ctx, "sb-broken"), errdefs.Internal, api.CodeDestroyFailed)
	if listed(a)["sb-broken"] || layers.held("sb-broken") != 1 {
		t.Errorf("broken: listed %v, view held %d", listed(a), layers.held("sb-broken"))
	}
}

// TestEnded: a sandbox that ends by itself is forgotten and its view
// released; one that ends while its create runs fails the create as
// retryable (sandbox_ended) and leaves nothing.
func TestEnded(t *testing.T) {
	plainState(t)
	rt := newFakeRuntime(api.TierContainer)
	layers := newFakeLayers()
	a := newTestService(t, Options{Layers: layers, StateDir: t.TempDir()}, rt)
	ctx := context.Background()
	if err := a.Create(ctx, noderpc.CreateRequest{ID: "sb-1", Tier: api.TierContainer, Image: layeredImage("L1")}); err != nil {
		t.Fatal(err)
	}
	rt.end("sb-1", sandbox.EndAgentExited)
	if listed(a)["sb-1"] || layers.held("L1") != 0 || len(a.state.all()) != 0 {
		t.Errorf("after its end: listed %v, view held %d, state %v", listed(a), layers.held("L1"), a.state.all())
	}
	if _, _, err := a.lookup("sb-1"); errdefs.ClassOf(err) != errdefs.NotFound {
		t.Errorf("lookup of an ended sandbox: %v", err)
	}

	rt.onCreate = func(spec sandbox.Spec) error {
		rt.end(spec.ID, sandbox.EndGuestPanicked) // before Create returns
		return nil
	}
	err := a.Create(ctx, noderpc.CreateRequest{ID: "sb-2", Tier: api.TierContainer, Image: layeredImage("L2")})
	wantCode(t, err, errdefs.Unavailable, api.CodeSandboxEnded)
	waitFor(t, "the view to be released", func() bool { return layers.held("L2") == 0 })
	if listed(a)["sb-2"] || len(a.state.all()) != 0 {
		t.Errorf("after an end during create: listed %v, state %v", listed(a), a.state.all())
	}
}

// writeState stores sandbox id's state as a previous agent left it.
func writeState(t *testing.T, dir, id, layer string) {
	t.Helper()
	st := &stateDir{dir: dir}
	if err := st.put(id, api.TierContainer, layeredImage(layer), nil); err != nil {
		t.Fatal(err)
	}
}

// TestRecover: after a restart the node re-acquires the views its
// sandboxes held, adopts what the runtimes recover, releases the views
// of sandboxes the runtimes lost, drops states it cannot use, and then
// collects unused layers.
func TestRecover(t *testing.T) {
	plainState(t)
	dir := t.TempDir()
	writeState(t, dir, "sb-kept", "L-kept")
	writeState(t, dir, "sb-lost", "L-lost")
	writeState(t, dir, "sb-nolayer", "L-gone")
	if err := os.WriteFile(filepath.Join(dir, "sb-torn.json"), []byte(`{"tier": "con`), 0o600); err != nil {
		t.Fatal(err)
	}
	ct, fn := newFakeRuntime(api.TierContainer), newFakeRuntime(api.TierFunction)
	ct.recovered = []string{"sb-kept"}
	fn.recovered = []string{"sb-fn"} // no image view: the function tier's own
	layers := newFakeLayers()
	layers.fail["L-gone"] = true
	a := newTestService(t, Options{Layers: layers, StateDir: dir}, ct, fn)

	if got := listed(a); len(got) != 2 || !got["sb-kept"] || !got["sb-fn"] {
		t.Errorf("adopted %v", got)
	}
	if layers.held("L-kept") != 1 || layers.held("L-lost") != 0 {
		t.Errorf("views held: kept %d, lost %d", layers.held("L-kept"), layers.held("L-lost"))
	}
	st := a.state.all()
	if _, ok := st["sb-kept"]; !ok || len(st) != 1 {
		t.Errorf("states left %v, want only sb-kept's", st)
	}
	if layers.gcs != 1 {
		t.Errorf("%d collections", layers.gcs)
	}
	// The adopted sandbox's view goes with its destroy.
	if err := a.Destroy(context.Background(), "sb-kept"); err != nil {
		t.Fatal(err)
	}
	if layers.held("L-kept") != 0 || len(a.state.all()) != 0 {
		t.Errorf("after destroying the adopted sandbox: view held %d, state %v", layers.held("L-kept"), a.state.all())
	}
}

// TestRecoverEndDuringAdoption: a sandbox that ends while its runtime
// re-adopts it is not adopted, and its view is released.
func TestRecoverEndDuringAdoption(t *testing.T) {
	plainState(t)
	dir := t.TempDir()
	writeState(t, dir, "sb-1", "L1")
	rt := newFakeRuntime(api.TierContainer)
	rt.recovered = []string{"sb-1", "sb-2"}
	rt.onRecover = func() { rt.end("sb-1", sandbox.EndAgentExited) }
	layers := newFakeLayers()
	a := newTestService(t, Options{Layers: layers, StateDir: dir}, rt)
	if got := listed(a); len(got) != 1 || !got["sb-2"] {
		t.Errorf("adopted %v, want sb-2 only", got)
	}
	if layers.held("L1") != 0 {
		t.Errorf("the ended sandbox's view is held %d times", layers.held("L1"))
	}
}

// TestRecoverFails: a runtime that cannot recover fails the start.
func TestRecoverFails(t *testing.T) {
	rt := newFakeRuntime(api.TierContainer)
	rt.recoverErr = fmt.Errorf("reading state: %w", os.ErrPermission)
	reg := sandbox.NewRegistry()
	if err := reg.Register(rt); err != nil {
		t.Fatal(err)
	}
	a, err := New(Options{ID: "n1", Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.recover(context.Background()); err == nil {
		t.Fatal("recover succeeded")
	}
}
