package function

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
)

// Sandbox is a function-tier sandbox: a workspace directory and the image
// its commands come from. It is safe for concurrent use; calls run in
// parallel, each in its own instance.
type Sandbox struct {
	rt      *Runtime
	spec    sandbox.Spec
	dir     string // <StateDir>/sandboxes/<id>
	workDir string // dir/workspace
	tmpfs   bool   // workDir is a tmpfs of spec.DiskMB
	img     *image
	work    *os.Root // workDir, for the files API and module loading
	workFS  experimentalsys.FS

	// phase is the current phase; calls derive from its context.
	phase phaseState

	// life ends on Destroy (or the runtime's Close); calls derive from it.
	life context.Context
	kill context.CancelFunc
	// ops counts calls and file operations; Destroy closes it and waits.
	ops gate

	memBytes  atomic.Int64 // linear memory of running calls
	busyNanos atomic.Int64 // wall time spent in calls
	running   atomic.Int32

	destroyOnce sync.Once
	destroyErr  error

	markMu   sync.Mutex        // guards following field
	lastMark *sandbox.StepMark // the last step's closing mark (steps.go)
}

var (
	_ sandbox.Sandbox       = (*Sandbox)(nil)
	_ sandbox.ProcessRunner = (*Sandbox)(nil)
)

// ID implements sandbox.Sandbox.
func (s *Sandbox) ID() string { return s.spec.ID }

// Files implements sandbox.Sandbox.
func (s *Sandbox) Files() sandbox.Files { return (*files)(s) }

// Stats implements sandbox.Sandbox. MemoryBytes is the linear memory of
// the calls running now (0 when idle); CPUSeconds is the wall time spent
// in calls, which is CPU time for all but sleeping or blocked guests;
// Processes is the number of calls running.
func (s *Sandbox) Stats(ctx context.Context) (sandbox.Stats, error) {
	if !s.ops.enter() {
		return sandbox.Stats{}, sandbox.ErrGone(s.spec.ID)
	}
	defer s.ops.leave()
	disk, err := diskUsage(s.workDir, s.tmpfs)
	if err != nil {
		return sandbox.Stats{}, err
	}
	return sandbox.Stats{
		MemoryBytes: s.memBytes.Load(),
		DiskBytes:   disk,
		CPUSeconds:  time.Duration(s.busyNanos.Load()).Seconds(),
		Processes:   int(s.running.Load()),
		// The limits the sandbox was made with (its linear memory and
		// workspace caps).
		MemoryLimitBytes: int64(s.spec.MemoryMB) << 20,
		DiskLimitBytes:   int64(s.spec.DiskMB) << 20,
	}, nil
}

// StartProcess implements sandbox.ProcessRunner: the function tier has no
// background processes.
func (s *Sandbox) StartProcess(context.Context, sandbox.ExecRequest) (sandbox.Process, error) {
	return nil, sandbox.Unsupported(Tier, "background processes")
}

// Processes implements sandbox.ProcessRunner; there are none.
func (s *Sandbox) Processes() []api.Process { return nil }

// Process implements sandbox.ProcessRunner.
func (s *Sandbox) Process(int) (sandbox.Process, error) {
	return nil, sandbox.Unsupported(Tier, "background processes")
}

// Destroy implements sandbox.Sandbox: it stops running calls, waits for
// them, unmounts and removes the workspace. It is idempotent.
func (s *Sandbox) Destroy(ctx context.Context) error {
	s.destroyOnce.Do(func() {
		idle := s.ops.close()
		s.kill()
		<-idle // cancelled calls end promptly
		s.rt.forget(s)
		s.work.Close()
		s.destroyErr = removeOwnDir(s.dir, s.tmpfs)
	})
	return s.destroyErr
}

// release closes the sandbox's handles without touching its files (the
// runtime is closing; a later Recover adopts the sandbox again).
func (s *Sandbox) release() {
	idle := s.ops.close()
	s.kill()
	<-idle
	s.work.Close()
}

// enter starts an operation on the sandbox.
func (s *Sandbox) enter() error {
	if !s.ops.enter() {
		return sandbox.ErrGone(s.spec.ID)
	}
	return nil
}

func (r *Runtime) forget(s *Sandbox) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sandboxes[s.spec.ID] == s {
		delete(r.sandboxes, s.spec.ID)
	}
}

// removeSandboxDir unmounts a sandbox's workspace (every tmpfs stacked
// there) and removes its directory.
func removeSandboxDir(dir string) error {
	work := filepath.Join(dir, "workspace")
	for i := 0; i < 8 && isTmpfsMount(work); i++ {
		if err := unmountWorkspace(work); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return nil
}

// removeOwnDir removes the directory of a sandbox this runtime made, in
// the few calls its usual layout needs (the workspace unmounted, the
// state file and two directories removed); anything else there falls
// back to removeSandboxDir. (removeSandboxDir's probing and walking took
// a tenth of the function tier's create → exec → delete cycle.)
func removeOwnDir(dir string, tmpfs bool) error {
	work := filepath.Join(dir, "workspace")
	if tmpfs {
		if err := unmountWorkspace(work); err != nil {
			return err
		}
	}
	if sys.Rmdir(work) == nil && sys.Unlink(filepath.Join(dir, stateName)) == nil && sys.Rmdir(dir) == nil {
		return nil
	}
	return removeSandboxDir(dir)
}

// mkdirs makes dir and then work in it (two calls, where MkdirAll probes
// every level first).
func mkdirs(dir, work string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return os.MkdirAll(work, 0o755)
	}
	return os.Mkdir(work, 0o755)
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Create implements sandbox.Runtime.
func (r *Runtime) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if !idPattern.MatchString(spec.ID) {
		return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidSandboxID, "sandbox ID %q is not a valid name", spec.ID)
	}
	if spec.Image.Root == "" {
		return nil, errdefs.New(errdefs.Invalid, api.CodeImageRequired, "the function tier needs an image")
	}
	if spec.DiskMB <= 0 {
		spec.DiskMB = defaultDiskMB
	}
	r.mu.Lock()
	switch _, dup := r.sandboxes[spec.ID]; {
	case r.closed:
		r.mu.Unlock()
		return nil, errClosed()
	case dup:
		r.mu.Unlock()
		return nil, errdefs.New(errdefs.Conflict, api.CodeSandboxExists, "sandbox %s already exists", spec.ID)
	}
	r.sandboxes[spec.ID] = nil // reserve the ID
	r.mu.Unlock()

	var cu cleanups
	defer cu.clean()
	cu.add(func() {
		r.mu.Lock()
		if r.sandboxes != nil && r.sandboxes[spec.ID] == nil {
			delete(r.sandboxes, spec.ID)
		}
		r.mu.Unlock()
	})
	img, err := r.image(spec.Image.Root)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(r.opts.StateDir, "sandboxes", spec.ID)
	// Leftovers of a sandbox with this ID that no Recover adopted.
	if _, err := os.Lstat(dir); err == nil {
		if err := removeSandboxDir(dir); err != nil {
			return nil, err
		}
	}
	work := filepath.Join(dir, "workspace")
	if err := mkdirs(dir, work); err != nil {
		return nil, err
	}
	cu.add(func() {
		if err := removeSandboxDir(dir); err != nil {
			r.log.Warn("function sandbox: removing after a failed create", "id", spec.ID, "err", err)
		}
	})
	tmpfs := true
	if err := mountWorkspace(work, spec.DiskMB); err != nil {
		if !errors.Is(err, errdefs.ErrNotSupported) {
			return nil, err
		}
		tmpfs = false
		r.warnOnce.Do(func() {
			r.log.Warn("function sandboxes get plain workspace directories: their disk caps are not enforced", "err", err)
		})
	}
	// A snapshot's image brings the workspace it was taken of.
	if err := seedWorkspace(spec.Image.Root, work); err != nil {
		return nil, err
	}
	if err := createState(dir, stateFile{Version: 1, Spec: spec, Tmpfs: tmpfs}); err != nil {
		return nil, err
	}
	sb, err := r.adopt(spec, dir, tmpfs, img)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		sb.release()
		return nil, errClosed()
	}
	r.sandboxes[spec.ID] = sb
	r.mu.Unlock()
	cu.release()
	return sb, nil
}

// adopt makes the Sandbox value for a sandbox whose directory is ready.
func (r *Runtime) adopt(spec sandbox.Spec, dir string, tmpfs bool, img *image) (*Sandbox, error) {
	work := filepath.Join(dir, "workspace")
	root, err := os.OpenRoot(work)
	if err != nil {
		return nil, err
	}
	life, kill := context.WithCancel(r.life)
	sb := &Sandbox{
		rt:      r,
		spec:    spec,
		dir:     dir,
		workDir: work,
		tmpfs:   tmpfs,
		img:     img,
		work:    root,
		life:    life,
		kill:    kill,
	}
	sb.workFS = phaseFS{FS: newWorkspaceFS(work), s: sb}
	sb.initPhase()
	return sb, nil
}

// image returns the opened image at path, reopening it if the directory
// was replaced.
func (r *Runtime) image(path string) (*image, error) {
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errdefs.Wrap(errdefs.NotFound, api.CodeImageNotFound, err, "image directory %s does not exist", path)
		}
		return nil, err
	}
	r.mu.Lock()
	img := r.images[path]
	r.mu.Unlock()
	if img != nil && img.ino == inode(fi) {
		return img, nil
	}
	img, err = openImage(path)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		img.root.Close()
		return nil, errClosed()
	}
	// A replaced image stays open for the sandboxes still using it.
	r.images[path] = img
	return img, nil
}
