package node

import (
	"context"
	"github.com/dsec-dev/dsec/internal/testenv"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layercache"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// fakeRuntime is a tier runtime that makes fakeSandboxes. Hooks decide
// what Create and Recover do; it notices ends when a test calls end.
type fakeRuntime struct {
	tier string
	caps sandbox.Capabilities

	mu sync.Mutex // guards following fields
	// onCreate, if set, runs in Create; its error is Create's, and then
	// nothing is made (the contract: on error nothing is left).
	onCreate   func(spec sandbox.Spec) error
	specs      []sandbox.Spec
	made       map[string]*fakeSandbox
	recovered  []string
	recoverErr error
	// onRecover, if set, runs in Recover before it returns.
	onRecover func()
	onEnd     func(sandbox.Ended)
	// wrap, if set, makes what Create returns from the fake sandbox.
	wrap func(*fakeSandbox) sandbox.Sandbox
}

func newFakeRuntime(tier string) *fakeRuntime {
	return &fakeRuntime{tier: tier, caps: sandbox.Capabilities{FileRoot: "/"}, made: map[string]*fakeSandbox{}}
}

func (r *fakeRuntime) Tier() string                       { return r.tier }
func (r *fakeRuntime) Capabilities() sandbox.Capabilities { return r.caps }
func (r *fakeRuntime) Close(ctx context.Context) error    { return nil }

func (r *fakeRuntime) Fingerprint(ctx context.Context) api.TierInfo {
	return api.TierInfo{Name: r.tier, Available: true}
}

func (r *fakeRuntime) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	r.mu.Lock()
	r.specs = append(r.specs, spec)
	hook := r.onCreate
	r.mu.Unlock()
	if hook != nil {
		if err := hook(spec); err != nil {
			return nil, err
		}
	}
	sb := &fakeSandbox{id: spec.ID}
	r.mu.Lock()
	r.made[spec.ID] = sb
	wrap := r.wrap
	r.mu.Unlock()
	if wrap != nil {
		return wrap(sb), nil
	}
	return sb, nil
}

func (r *fakeRuntime) Recover(ctx context.Context) ([]sandbox.Sandbox, error) {
	r.mu.Lock()
	defer func() {
		if r.onRecover != nil {
			r.onRecover()
		}
	}()
	defer r.mu.Unlock()
	if r.recoverErr != nil {
		return nil, r.recoverErr
	}
	var out []sandbox.Sandbox
	for _, id := range r.recovered {
		sb := &fakeSandbox{id: id}
		r.made[id] = sb
		if r.wrap != nil {
			out = append(out, r.wrap(sb))
			continue
		}
		out = append(out, sb)
	}
	return out, nil
}

func (r *fakeRuntime) OnEnd(fn func(sandbox.Ended)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onEnd = fn
}

// end reports that sandbox id ended by itself, as the runtime would
// after releasing it.
func (r *fakeRuntime) end(id, code string) {
	r.mu.Lock()
	fn := r.onEnd
	r.mu.Unlock()
	if fn != nil {
		fn(sandbox.Ended{ID: id, Code: code})
	}
}

func (r *fakeRuntime) sandbox(id string) *fakeSandbox {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.made[id]
}

func (r *fakeRuntime) creates() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.specs)
}

// fakeSandbox counts its destroys; destroyErr, if set, fails them.
// Other calls are not faked (they panic).
type fakeSandbox struct {
	sandbox.Sandbox
	id string

	mu         sync.Mutex // guards following fields
	destroys   int
	destroyErr error
}

func (s *fakeSandbox) ID() string { return s.id }

func (s *fakeSandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.destroys++
	return s.destroyErr
}

func (s *fakeSandbox) destroyed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.destroys
}

// fakeLayers is the layer cache: views refcounted by their bottom layer's
// ID; a view of a layer in fail cannot be made.
type fakeLayers struct {
	mu   sync.Mutex // guards following fields
	refs map[string]int
	fail map[string]bool
	gcs  int
}

func newFakeLayers() *fakeLayers { return &fakeLayers{refs: map[string]int{}, fail: map[string]bool{}} }

func (l *fakeLayers) View(ctx context.Context, layers []layercache.Layer) (string, func(), error) {
	key := layers[0].ID
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail[key] {
		return "", nil, errdefs.New(errdefs.NotFound, api.CodeLayerNotFound, "layer %s is gone", key)
	}
	l.refs[key]++
	var once sync.Once
	return "/views/" + key, func() {
		once.Do(func() {
			l.mu.Lock()
			l.refs[key]--
			l.mu.Unlock()
		})
	}, nil
}

func (l *fakeLayers) GC(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gcs++
	return nil
}

func (l *fakeLayers) held(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refs[id]
}

// plainState makes the node keep its state in dir without mounting a
// tmpfs there, for the test's duration.
func plainState(t *testing.T) {
	t.Helper()
	prev := openState
	openState = func(dir string) (*stateDir, error) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		return &stateDir{dir: dir}, nil
	}
	t.Cleanup(func() { openState = prev })
}

// newTestService returns an agent over rts, recovered (as Start does
// before it serves), with no NATS connection: ends are not reported.
func newTestService(t *testing.T, opt Options, rts ...*fakeRuntime) *Service {
	t.Helper()
	reg := sandbox.NewRegistry()
	for _, rt := range rts {
		if err := reg.Register(rt); err != nil {
			t.Fatal(err)
		}
	}
	if opt.ID == "" {
		opt.ID = "n1"
	}
	opt.Registry = reg
	a, err := New(opt)
	if err != nil {
		t.Fatal(err)
	}
	a.bg = context.Background()
	if err := a.recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.stopEnds(); testenv.WaitGroup(t, &a.wg, wait, "the service's handlers and loops") })
	return a
}

// listed returns the IDs of the sandboxes the node lists.
func listed(a *Service) map[string]bool {
	out := map[string]bool{}
	for _, s := range a.List() {
		out[s.ID] = true
	}
	return out
}

func dirImage(t *testing.T) noderpc.ImageRef {
	return noderpc.ImageRef{ID: "img", Name: "img", Source: "dir:" + t.TempDir()}
}

func layeredImage(layer string) noderpc.ImageRef {
	return noderpc.ImageRef{ID: "img-" + layer, Name: "img", Source: "layers", Layers: []noderpc.LayerRef{{ID: layer}}}
}

func wantCode(t *testing.T, err error, class errdefs.Class, code string) {
	t.Helper()
	if errdefs.ClassOf(err) != class || errdefs.CodeOf(err) != code {
		t.Fatalf("error %v (%s %s), want %s %s", err, errdefs.ClassOf(err), errdefs.CodeOf(err), class, code)
	}
}

// wait bounds every wait of these tests: long enough for a loaded
// machine, short enough that a hung test fails instead of hanging its
// package.
const wait = 30 * time.Second

// hold blocks a fake's call until the test lets it go, or until wait
// has passed, so that a test that failed before letting it go cannot
// leave the call blocked.
func hold(proceed <-chan struct{}) {
	select {
	case <-proceed:
	case <-time.After(wait):
	}
}
