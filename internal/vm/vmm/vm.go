package vmm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Error codes of this package (besides CodeInvalidConfig).
const (
	CodeStartFailed   = api.CodeVMStartFailed   // QEMU did not start or its QMP did not answer
	CodeRunDirBusy    = api.CodeVMRunDirBusy    // RunDir holds another VM's sockets
	CodeNotFound      = api.CodeVMNotFound      // Adopt: the process is gone
	CodeAdoptMismatch = api.CodeVMAdoptMismatch // Adopt: the pid is not that VM's QEMU
	CodeBootTimeout   = api.CodeBootTimeout     // WaitReady: the guest was not ready in time
	CodeBootFailed    = api.CodeBootFailed      // WaitReady: the guest exited or its readiness check failed
	CodeKillFailed    = api.CodeVMKillFailed    // the process survived SIGKILL for too long
)

// killWait bounds the wait for a SIGKILLed QEMU to be gone.
const killWait = 10 * time.Second

// pollInterval is how often an adopted VM (not our child, so there is no
// wait to block in) is checked for exit.
const pollInterval = 200 * time.Millisecond

// VM is one running QEMU process. Its methods are safe for concurrent use.
//
// When the process ends, for whatever reason, the handle closes QMP, stops
// copying the serial console and removes the sockets; the serial log stays
// (WaitReady's and Start's failures remove it too).
type VM struct {
	// Pid is QEMU's process id.
	Pid int
	// Started tells when Start passed its steps (zero for an adopted VM).
	Started StartTimes

	cfg   Config
	start uint64     // the process's start time: with Pid, its identity
	pidfd *sys.Pidfd // SIGKILL goes through it: never to a reused pid
	cmd   *exec.Cmd  // nil for an adopted VM
	errs  *tailBuffer

	exited chan struct{} // closed when the process is gone and cleaned up
	stop   chan struct{} // closed by Release

	mu       sync.Mutex // guards following fields
	qmp      *QMP
	serial   net.Conn
	serialWG sync.WaitGroup
	log      *cappedLog
	state    *os.ProcessState
	released bool
}

// StartTimes are the moments Start passed its steps, for measurements.
type StartTimes struct {
	Spawn time.Time // QEMU's process started
	QMP   time.Time // QMP answered
	Cont  time.Time // the guest was let run (zero if Config.Paused)
}

// Start spawns QEMU for cfg, connects to its QMP socket and its serial
// console, and (unless cfg.Paused) lets the guest run. ctx bounds the start,
// not the VM's life. On failure nothing is left: no process, socket or log.
//
// Errors: errdefs.Invalid (CodeInvalidConfig), errdefs.Conflict
// (CodeRunDirBusy), errdefs.Unavailable (CodeStartFailed, whose cause holds
// the end of QEMU's stderr), or ctx's error.
func Start(ctx context.Context, cfg Config) (*VM, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	for _, s := range []string{QMPSocket, AgentSocket, SerialSocket} {
		// QEMU replaces an existing socket file: a leftover could be a
		// live VM's.
		if _, err := os.Lstat(filepath.Join(cfg.RunDir, s)); err == nil {
			return nil, errdefs.New(errdefs.Conflict, CodeRunDirBusy, "%s already holds %s", cfg.RunDir, s)
		}
	}
	var cu cleanup.Stack
	defer cu.Clean()

	logPath := filepath.Join(cfg.RunDir, SerialLog)
	log, err := openCappedLog(logPath, cfg.serialLogMax(), false)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, CodeStartFailed, err, "creating the serial log of %s", cfg.label())
	}
	cu.Add(func() { log.Close(); removeLog(logPath) })

	errs := &tailBuffer{max: 4096}
	cmd := exec.Command(cfg.binary(), cfg.Args()...)
	cmd.Env = []string{} // nothing of the node service's environment
	cmd.Stderr = errs
	cmd.SysProcAttr = sysProcAttr()
	if cfg.TapFD {
		// The tap is fd 3; passed files follow it (Config.file).
		if cfg.TapFile == nil {
			return nil, invalid("TapFD without a TapFile")
		}
		cmd.ExtraFiles = []*os.File{cfg.TapFile}
	}
	if u := cfg.User; u != nil {
		// setgroups(Groups), setgid, setuid, then exec: QEMU never runs
		// a root instruction of its own.
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: append([]uint32{}, u.Groups...)}
	}
	if cfg.PassFiles {
		files, err := openPassed(&cfg)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.Unavailable, CodeStartFailed, err, "opening the files of %s", cfg.label())
		}
		defer func() { // QEMU holds its copies
			for _, f := range files {
				f.Close()
			}
		}()
		cmd.ExtraFiles = append(cmd.ExtraFiles, files...)
	}
	var times StartTimes
	if err := cmd.Start(); err != nil {
		removeSockets(cfg.RunDir)
		return nil, errdefs.Wrap(errdefs.Unavailable, CodeStartFailed, err, "starting qemu for %s", cfg.label())
	}
	times.Spawn = time.Now()
	vm := &VM{
		Pid:    cmd.Process.Pid,
		cfg:    cfg,
		cmd:    cmd,
		errs:   errs,
		exited: make(chan struct{}),
		stop:   make(chan struct{}),
		log:    log,
	}
	// Until the watcher runs, the process is ours to reap.
	vm.pidfd, err = sys.OpenPidfd(vm.Pid)
	if err == nil {
		_, vm.start, err = procStat(vm.Pid)
	}
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		if vm.pidfd != nil {
			vm.pidfd.Close()
		}
		removeSockets(cfg.RunDir)
		return nil, errdefs.Wrap(errdefs.Unavailable, CodeStartFailed, err, "watching qemu for %s", cfg.label())
	}
	go vm.watchChild()
	cu.Add(func() { vm.kill() })

	q, err := vm.dialQMP(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		vm.kill()
		return nil, errdefs.Wrap(errdefs.Unavailable, CodeStartFailed,
			fmt.Errorf("%w; qemu said: %q", err, strings.TrimSpace(errs.String())),
			"starting qemu for %s", cfg.label())
	}
	times.QMP = time.Now()
	vm.mu.Lock()
	vm.qmp = q
	vm.mu.Unlock()
	if err := vm.connectSerial(ctx); err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, CodeStartFailed, err, "connecting to the serial console of %s", cfg.label())
	}
	if !cfg.Paused {
		if err := q.Execute(ctx, "cont", nil, nil); err != nil {
			return nil, errdefs.Wrap(errdefs.Unavailable, CodeStartFailed, err, "starting the guest of %s", cfg.label())
		}
		times.Cont = time.Now()
	}
	vm.Started = times
	cu.Release()
	return vm, nil
}

// openPassed opens the files cfg.PassFiles hands to QEMU.
func openPassed(cfg *Config) ([]*os.File, error) {
	paths, write := cfg.passedFiles()
	var files []*os.File
	for i, p := range paths {
		flag := os.O_RDONLY
		if write[i] {
			flag = os.O_RDWR
		}
		f, err := os.OpenFile(p, flag|syscall.O_CLOEXEC, 0)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// dialQMP connects to the QMP socket QEMU creates during its start,
// retrying until it answers, QEMU exits, or ctx ends.
func (vm *VM) dialQMP(ctx context.Context) (*QMP, error) {
	path := filepath.Join(vm.cfg.RunDir, QMPSocket)
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		q, err := DialQMP(ctx, path)
		if err == nil {
			return q, nil
		}
		if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, err
		}
		select {
		case <-vm.exited:
			return nil, errors.New("qemu exited")
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// connectSerial connects to the serial console's socket and copies it
// into the capped log until the connection ends.
func (vm *VM) connectSerial(ctx context.Context) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", filepath.Join(vm.cfg.RunDir, SerialSocket))
	if err != nil {
		return err
	}
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.released || vm.log == nil {
		conn.Close()
		return errors.New("the VM is gone")
	}
	vm.serial = conn
	vm.serialWG.Add(1)
	go func(log *cappedLog) {
		defer vm.serialWG.Done()
		// A write error (a full disk) ends the copy; QEMU then drops the
		// console's output, which never blocks the guest for long.
		io.Copy(log, conn)
	}(vm.log)
	return nil
}

// watchChild reaps QEMU, our child, and cleans up after it.
func (vm *VM) watchChild() {
	vm.cmd.Wait()
	vm.mu.Lock()
	vm.state = vm.cmd.ProcessState
	vm.mu.Unlock()
	vm.afterExit()
}

// watchAdopted polls an adopted QEMU (not our child) until it is gone or
// the handle is released. QMP's end (QEMU closes it as it exits) makes it
// look at once.
func (vm *VM) watchAdopted(qmpDone <-chan struct{}) {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for procAlive(vm.Pid, vm.start) {
		select {
		case <-vm.stop:
			return // released: another handle may adopt the VM
		case <-qmpDone:
			qmpDone = nil
			t.Reset(10 * time.Millisecond)
		case <-t.C:
		}
	}
	vm.afterExit()
}

// afterExit releases what the handle holds and removes the sockets, unless
// the handle was released (then another handle may own them).
func (vm *VM) afterExit() {
	vm.mu.Lock()
	released := vm.released
	vm.mu.Unlock()
	if !released {
		vm.closeHandles()
		removeSockets(vm.cfg.RunDir)
	}
	close(vm.exited)
}

// closeHandles closes QMP, the serial copy and log, and the pidfd.
func (vm *VM) closeHandles() {
	vm.mu.Lock()
	q, serial, log, pidfd := vm.qmp, vm.serial, vm.log, vm.pidfd
	vm.qmp, vm.serial, vm.log, vm.pidfd = nil, nil, nil, nil
	vm.mu.Unlock()
	if q != nil {
		q.Close()
	}
	if serial != nil {
		serial.Close()
	}
	vm.serialWG.Wait()
	if log != nil {
		log.Close()
	}
	if pidfd != nil {
		pidfd.Close()
	}
}

func removeSockets(dir string) {
	for _, s := range []string{QMPSocket, AgentSocket, SerialSocket} {
		os.Remove(filepath.Join(dir, s))
	}
}

// QMP returns the VM's QMP client, or nil once the VM is gone or released.
func (vm *VM) QMP() *QMP {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.qmp
}

// User returns the identity QEMU runs as (Config.User), nil for the
// node's.
func (vm *VM) User() *User { return vm.cfg.User }

// AgentSocket returns the path of the host end of the agent's port.
func (vm *VM) AgentSocket() string { return filepath.Join(vm.cfg.RunDir, AgentSocket) }

// SerialLog returns the path of the serial console's log.
func (vm *VM) SerialLog() string { return filepath.Join(vm.cfg.RunDir, SerialLog) }

// Done is closed once the process is gone and its sockets removed.
func (vm *VM) Done() <-chan struct{} { return vm.exited }

// Wait waits until the process is gone and cleaned up.
func (vm *VM) Wait(ctx context.Context) error {
	select {
	case <-vm.exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ProcessState returns how QEMU exited: nil while it runs, and always
// for an adopted VM (the process is not our child).
func (vm *VM) ProcessState() *os.ProcessState {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.state
}

// Status runs query-status.
func (vm *VM) Status(ctx context.Context) (Status, error) {
	q := vm.QMP()
	if q == nil {
		return Status{}, fmt.Errorf("query-status: %w", ErrQMPClosed)
	}
	return q.QueryStatus(ctx)
}

// kill sends SIGKILL through the pidfd and waits (at most killWait) for
// the process to be gone.
func (vm *VM) kill() error {
	vm.mu.Lock()
	pidfd, released := vm.pidfd, vm.released
	vm.mu.Unlock()
	if released {
		return nil
	}
	if pidfd != nil {
		if err := pidfd.Kill(); err != nil {
			return errdefs.Wrap(errdefs.Internal, CodeKillFailed, err, "killing %s", vm.cfg.label())
		}
	}
	select {
	case <-vm.exited:
		return nil
	case <-time.After(killWait):
		return errdefs.New(errdefs.Internal, CodeKillFailed, "%s (pid %d) survived SIGKILL for %v", vm.cfg.label(), vm.Pid, killWait)
	}
}

// Kill sends SIGKILL to QEMU (through a pidfd, so never to a process that
// reused its pid) and waits until it is gone and cleaned up, or ctx ends.
func (vm *VM) Kill(ctx context.Context) error {
	vm.mu.Lock()
	pidfd, released := vm.pidfd, vm.released
	vm.mu.Unlock()
	if released {
		return nil
	}
	if pidfd != nil {
		if err := pidfd.Kill(); err != nil {
			return errdefs.Wrap(errdefs.Internal, CodeKillFailed, err, "killing %s", vm.cfg.label())
		}
	}
	return vm.Wait(ctx)
}

// Shutdown stops the VM, as gently as time allows: an ACPI power button
// press if the guest runs (waiting up to Config.ShutdownGrace for it to
// power off), then QMP quit, then SIGKILL. It returns once the process is
// gone, and fails only if it survives SIGKILL.
func (vm *VM) Shutdown(ctx context.Context) error {
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-vm.exited:
			return true
		case <-ctx.Done():
			return false
		case <-t.C:
			return false
		}
	}
	if q := vm.QMP(); q != nil {
		if s, err := q.QueryStatus(ctx); err == nil && s.Running {
			if q.Execute(ctx, "system_powerdown", nil, nil) == nil && wait(vm.cfg.shutdownGrace()) {
				return nil
			}
		}
		// quit's reply may not arrive: QEMU can close the socket first.
		if ctx.Err() == nil {
			q.Execute(ctx, "quit", nil, nil)
			if wait(2 * time.Second) {
				return nil
			}
		}
	}
	return vm.kill()
}

// Cont lets the guest of a VM started with Config.Paused run (QMP
// "cont"): the caller has done what had to precede the guest's first
// instruction, such as moving QEMU into its cgroup.
func (vm *VM) Cont(ctx context.Context) error {
	q := vm.QMP()
	if q == nil {
		return errdefs.New(errdefs.Unavailable, CodeStartFailed, "%s has no qmp connection", vm.cfg.label())
	}
	if err := q.Execute(ctx, "cont", nil, nil); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, CodeStartFailed, err, "starting the guest of %s", vm.cfg.label())
	}
	return nil
}

// Release forgets the VM without stopping it: QMP, the serial copy and the
// pidfd are closed; sockets and process stay, for Adopt. The node service
// uses it when it stops and leaves its VMs running. Afterwards Kill and
// Shutdown do nothing, and Done is closed only if QEMU is our child and
// exits.
func (vm *VM) Release() {
	vm.mu.Lock()
	if vm.released {
		vm.mu.Unlock()
		return
	}
	vm.released = true
	vm.mu.Unlock()
	close(vm.stop)
	vm.closeHandles()
}

// tailBuffer keeps the last max bytes written to it. It is safe for
// concurrent use.
type tailBuffer struct {
	max int
	mu  sync.Mutex // guards buf
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = slices.Delete(b.buf, 0, over)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
