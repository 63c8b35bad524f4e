package cgroups

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Bounds for waits when ctx has no deadline.
const (
	killTimeout   = 10 * time.Second
	freezeTimeout = 5 * time.Second
	// v1FreezeWait bounds the freeze that precedes a v1 kill round: a task
	// in uninterruptible sleep delays FROZEN, and the kill goes ahead.
	v1FreezeWait = 200 * time.Millisecond
)

// Freeze stops every task of the group and returns once all are stopped
// (cgroup.events "frozen 1", or freezer.state FROZEN on v1).
func (g *Group) Freeze(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx, freezeTimeout)
	defer cancel()
	if err := g.setFrozen(ctx, true); err != nil {
		return fmt.Errorf("freezing cgroup %s: %w", g.name, err)
	}
	return nil
}

// Thaw lets the group's tasks run again.
func (g *Group) Thaw(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx, freezeTimeout)
	defer cancel()
	if err := g.setFrozen(ctx, false); err != nil {
		return fmt.Errorf("thawing cgroup %s: %w", g.name, err)
	}
	return nil
}

func (g *Group) setFrozen(ctx context.Context, on bool) error {
	switch {
	case g.unified != "":
		v, want := "0", int64(0)
		if on {
			v, want = "1", 1
		}
		if err := writeFile(filepath.Join(g.unified, "cgroup.freeze"), v); err != nil {
			return err
		}
		return retry(ctx, func() (bool, error) {
			var r reads
			frozen := r.key(g.unified, "cgroup.events", "frozen")
			return r.err != nil || frozen == want, r.err
		})
	case g.freezer != "":
		state := "THAWED"
		if on {
			state = "FROZEN"
		}
		if err := writeFile(filepath.Join(g.freezer, "freezer.state"), state); err != nil {
			return err
		}
		return retry(ctx, func() (bool, error) {
			b, err := os.ReadFile(filepath.Join(g.freezer, "freezer.state"))
			return err != nil || strings.TrimSpace(string(b)) == state, err
		})
	}
	return errdefs.ErrNotSupported
}

// Kill SIGKILLs every task of the group and waits until the group is
// empty (its tasks may remain zombies until their parent reaps them; they
// hold no resources but a pid). With a cgroup2 group (v2 and hybrid) it
// writes cgroup.kill, which the kernel applies atomically, forks in
// flight included, even to a frozen group. On v1 it freezes the group,
// SIGKILLs each member through a pidfd (so a reused pid is never hit),
// thaws it, and repeats until the group is empty. It gives up when ctx
// ends (or after 10 s).
//
// On hybrid hosts AddProc puts a process into the cgroup2 group first, so
// cgroup.kill reaches every process AddProc handled. Reading the v1
// member lists to double-check would cost 110 µs (four v1 cgroup.procs
// reads), so Kill does not; Destroy does it for a v1 group whose rmdir
// finds it busy (a process someone else moved in).
func (g *Group) Kill(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx, killTimeout)
	defer cancel()
	if g.unified == "" {
		var errs []error
		for _, d := range g.dirs {
			errs = append(errs, g.killV1(ctx, d))
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("killing cgroup %s: %w", g.name, err)
		}
		return nil
	}
	if err := writeFile(filepath.Join(g.unified, "cgroup.kill"), "1"); err != nil {
		return fmt.Errorf("killing cgroup %s: %w", g.name, err)
	}
	if err := g.waitEmpty(ctx); err != nil {
		return fmt.Errorf("killing cgroup %s: %w", g.name, err)
	}
	return nil
}

// waitEmpty waits until the cgroup2 group has no task left ("populated
// 0" in cgroup.events). It keeps the file open and sleeps in poll(2)
// between reads, waking early when the kernel notifies a change: reading
// on a timer through open/read/close cost the node ~0.15 ms of CPU per
// destroy. The kernel delays a notification that follows another within
// 10 ms (the group became populated at its start, maybe just before), so
// the timeouts still back off from 50 µs, as retry's do, up to 10 ms.
func (g *Group) waitEmpty(ctx context.Context) error {
	f, err := os.Open(filepath.Join(g.unified, "cgroup.events"))
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 256)
	wait := 50 * time.Microsecond
	for {
		// A read also re-arms the notification (kernfs compares what
		// the reader last saw with the file's event count).
		n, err := f.ReadAt(buf, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if keyValue(string(buf[:n]), "populated") == 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("tasks left: %w", err)
		}
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl))
		}
		if err := sys.WaitModified(f, max(wait, 0)); err != nil {
			return err
		}
		wait = min(2*wait, 10*time.Millisecond)
	}
}

// killV1 kills the members of the v1 group dir until it is empty.
func (g *Group) killV1(ctx context.Context, dir string) error {
	return retry(ctx, func() (bool, error) {
		pids, err := readProcs(dir)
		if err != nil || len(pids) == 0 {
			return true, err
		}
		// A frozen group cannot fork while its members are listed and
		// killed (on hybrid hosts the v1 freezer is not in use).
		freeze := g.freezer != "" && g.unified == ""
		if freeze {
			fctx, cancel := context.WithTimeout(ctx, v1FreezeWait)
			_ = g.setFrozen(fctx, true) // a partial freeze still helps
			cancel()
		}
		err = signalMembers(dir, pids)
		if freeze {
			if terr := g.setFrozen(ctx, false); err == nil {
				err = terr
			}
		}
		return false, err
	})
}

// signalMembers SIGKILLs the processes pids that are members of dir. It
// opens a pidfd for each, re-reads the member list, and signals only
// pidfds whose pid is still listed: if a pid was reused before its pidfd
// was opened, the new process is not a member and is left alone.
func signalMembers(dir string, pids []int) error {
	fds := make(map[int]*sys.Pidfd, len(pids))
	defer func() {
		for _, fd := range fds {
			_ = fd.Close()
		}
	}()
	for _, pid := range pids {
		if fd, err := sys.OpenPidfd(pid); err == nil {
			fds[pid] = fd
		}
	}
	now, err := readProcs(dir)
	if err != nil {
		return err
	}
	member := make(map[int]bool, len(now))
	for _, pid := range now {
		member[pid] = true
	}
	var errs []error
	for pid, fd := range fds {
		if member[pid] {
			if err := fd.Kill(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
