package vmtier

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/sys"
)

// orphanWait bounds the wait for a killed orphan QEMU to be gone.
const orphanWait = 5 * time.Second

// sweepLeftovers is the end of Recover: with live the sandboxes it
// re-adopted, it kills every QEMU of this runtime that belongs to none of
// them (a process whose command line names a run directory under
// StateDir: a create that crashed before its state file was written, or
// a VM whose state file was lost), removes run directories no live
// sandbox owns, and removes the cgroups (Jail.Cgroups) no live sandbox
// owns. A QEMU is recognised by its QMP socket path, which vmm.Config.Args
// always puts on its command line.
func (r *Runtime) sweepLeftovers(ctx context.Context, live map[string]bool) error {
	var errs []error
	orphans, err := r.orphanQEMUs(live)
	if err != nil {
		errs = append(errs, err)
	}
	for _, o := range orphans {
		r.log.Warn("killing a QEMU no sandbox owns", "pid", o.pid, "id", o.id)
		if err := killOrphan(ctx, o); err != nil {
			errs = append(errs, err)
		}
	}
	entries, err := os.ReadDir(r.opt.StateDir)
	if err != nil {
		errs = append(errs, err)
	}
	for _, e := range entries {
		if !live[e.Name()] {
			if err := os.RemoveAll(filepath.Join(r.opt.StateDir, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if j := r.opt.Jail; j != nil && j.Cgroups != nil {
		var keep []string
		for id := range live {
			keep = append(keep, id)
		}
		if err := j.Cgroups.Sweep(ctx, keep); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// orphan is a QEMU process of this runtime's StateDir no sandbox owns.
type orphan struct {
	pid  int
	id   string // the sandbox ID its run directory is named after
	mark string // the argument that names it: checked again before the kill
}

// orphanQEMUs lists the QEMU processes whose QMP socket is in a run
// directory under StateDir not in live.
func (r *Runtime) orphanQEMUs(live map[string]bool) ([]orphan, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	// vmm writes "path=<RunDir>/qmp.sock" with commas doubled.
	prefix := "path=" + strings.ReplaceAll(r.opt.StateDir, ",", ",,") + "/"
	var out []orphan
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		argv, err := cmdline(pid)
		if err != nil || len(argv) == 0 || !strings.HasPrefix(filepath.Base(argv[0]), "qemu-system") {
			continue
		}
		for _, a := range argv {
			i := strings.Index(a, prefix)
			if i < 0 || !strings.Contains(a, "id=qmp,") {
				continue
			}
			id, _, _ := strings.Cut(a[i+len(prefix):], "/")
			if id != "" && !live[id] {
				out = append(out, orphan{pid: pid, id: id, mark: a})
			}
			break
		}
	}
	return out, nil
}

// killOrphan SIGKILLs o through a pidfd, after checking (with the pidfd
// open) that the pid still names that QEMU, and waits for it to be gone.
func killOrphan(ctx context.Context, o orphan) error {
	pfd, err := sys.OpenPidfd(o.pid)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer pfd.Close()
	argv, err := cmdline(o.pid)
	if err != nil || !slices.Contains(argv, o.mark) {
		return nil // it exited, and the pid is another process's now
	}
	if err := pfd.Kill(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, orphanWait)
	defer cancel()
	for {
		if argv, err := cmdline(o.pid); err != nil || len(argv) == 0 || !slices.Contains(argv, o.mark) {
			return nil // gone, or a zombie (whose cmdline is empty)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("QEMU %d (sandbox %s) survived SIGKILL: %w", o.pid, o.id, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// cmdline returns the argv of pid.
func cmdline(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return nil, nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), nil
}
