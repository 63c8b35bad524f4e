package vmm

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Adopt re-attaches to the QEMU process pid started for cfg (by Start, in
// an earlier life of the node service): it checks that pid is still that
// QEMU, connects to its QMP socket and serial console, and returns a
// handle as Start would (its serial log goes on after what it holds).
//
// Identity is checked twice: the process's argv must be QEMU's with the
// QMP socket of cfg.RunDir, and the QMP socket's listener must belong to
// pid (SO_PEERCRED). The kill path uses a pidfd opened before the checks,
// so a pid reused meanwhile is never signalled.
//
// Errors: errdefs.Invalid (CodeInvalidConfig), errdefs.NotFound
// (CodeNotFound: the process is gone), errdefs.Conflict (CodeAdoptMismatch:
// pid is another process), errdefs.Unavailable (CodeStartFailed: QMP or
// the console did not answer).
func Adopt(ctx context.Context, cfg Config, pid int) (*VM, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var cu cleanup.Stack
	defer cu.Clean()
	notFound := func(err error) error {
		return errdefs.Wrap(errdefs.NotFound, CodeNotFound, err, "%s (pid %d) is gone", cfg.label(), pid)
	}
	mismatch := func(format string, args ...any) error {
		return errdefs.New(errdefs.Conflict, CodeAdoptMismatch, "pid %d is not the qemu of %s: "+format,
			append([]any{pid, cfg.label()}, args...)...)
	}
	pidfd, err := sys.OpenPidfd(pid)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, notFound(err)
		}
		return nil, errdefs.Wrap(errdefs.Unavailable, CodeStartFailed, err, "adopting %s", cfg.label())
	}
	cu.Add(func() { pidfd.Close() })
	state, start, err := procStat(pid)
	if err != nil {
		return nil, notFound(err)
	}
	if state == 'Z' || state == 'X' {
		return nil, notFound(errors.New("the process has exited"))
	}
	argv, err := procCmdline(pid)
	if err != nil {
		return nil, notFound(err)
	}
	// argv is QEMU's and names this VM's QMP socket, exactly as Args
	// writes it.
	want := cfg.Args()
	qmpArg := want[slices.Index(want, "-mon")-1]
	if len(argv) == 0 || !strings.HasPrefix(filepath.Base(argv[0]), "qemu-system") || !slices.Contains(argv, qmpArg) {
		return nil, mismatch("its command line does not name %s", filepath.Join(cfg.RunDir, QMPSocket))
	}
	// Still the same process: the argv read above was its own.
	if !procAlive(pid, start) {
		return nil, notFound(errors.New("the process exited while being checked"))
	}

	vm := &VM{
		Pid:    pid,
		cfg:    cfg,
		start:  start,
		pidfd:  pidfd,
		errs:   &tailBuffer{max: 1},
		exited: make(chan struct{}),
		stop:   make(chan struct{}),
	}
	q, err := DialQMP(ctx, filepath.Join(cfg.RunDir, QMPSocket))
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errdefs.Wrap(errdefs.Unavailable, CodeStartFailed, err, "connecting to the qmp of %s", cfg.label())
	}
	cu.Add(func() { q.Close() })
	if peer, err := peerPid(q.conn); err != nil || peer != pid {
		return nil, mismatch("the qmp socket belongs to pid %d (%v)", peer, err)
	}
	logPath := filepath.Join(cfg.RunDir, SerialLog)
	log, err := openCappedLog(logPath, cfg.serialLogMax(), true)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, CodeStartFailed, err, "opening the serial log of %s", cfg.label())
	}
	cu.Add(func() { log.Close() })
	vm.qmp, vm.log = q, log
	if err := vm.connectSerial(ctx); err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, CodeStartFailed, err, "connecting to the serial console of %s", cfg.label())
	}
	cu.Release()
	go vm.watchAdopted(q.Done())
	return vm, nil
}
