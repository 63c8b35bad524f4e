package cgroups

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Bounds for waits when ctx has no deadline.
const (
	killTimeout   = 10 * time.Second
	freezeTimeout = 5 * time.Second
	// thawTimeout bounds a thaw, which never waits for the caller's
	// context: a group left frozen would stop its sandbox for good.
	thawTimeout = 5 * time.Second
	// v1FreezeWait bounds the freeze that precedes a v1 kill round: a task
	// in uninterruptible sleep delays FROZEN, and the kill goes ahead.
	v1FreezeWait = 200 * time.Millisecond
)

// ErrNotFrozen is wrapped by Freeze's error when the group did not reach
// frozen in time. Freeze has thawed it again: its tasks run on.
var ErrNotFrozen = errors.New("did not freeze in time")

// ErrGone is wrapped by KillExcept's error when the process to keep is
// gone.
var ErrGone = errors.New("process gone")

// Freeze stops every task of the group and returns once all are stopped
// (cgroup.events "frozen 1", or freezer.state FROZEN on v1). A task in
// uninterruptible sleep (a stuck FUSE or NFS request, say) cannot stop
// until it returns to user space, and a loaded host can take long; if the
// group is not frozen when ctx ends (or after 5 s) Freeze thaws it again
// and returns an error wrapping ErrNotFrozen that names the tasks in
// uninterruptible sleep. So a failed Freeze never leaves a group
// freezing with nobody to thaw it.
func (g *Group) Freeze(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx, freezeTimeout)
	defer cancel()
	err := g.setFrozen(ctx, true)
	if err == nil {
		return nil
	}
	if terr := g.thaw(); terr != nil {
		return fmt.Errorf("freezing cgroup %s: %w; thawing it again: %w", g.name, err, terr)
	}
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (%w)%s", ErrNotFrozen, ctx.Err(), g.stuckNote())
	}
	return fmt.Errorf("freezing cgroup %s: %w; thawed again", g.name, err)
}

// Thaw lets the group's tasks run again. It does not stop at ctx's end:
// it waits up to 5 s for the group to report thawed, whatever ctx says,
// since a caller whose time ran out is the one that most needs its group
// running again.
func (g *Group) Thaw(ctx context.Context) error {
	if err := g.thaw(); err != nil {
		return fmt.Errorf("thawing cgroup %s: %w", g.name, err)
	}
	return nil
}

func (g *Group) thaw() error {
	ctx, cancel := context.WithTimeout(context.Background(), thawTimeout)
	defer cancel()
	return g.setFrozen(ctx, false)
}

// Frozen reports whether the group is frozen or freezing.
func (g *Group) Frozen() bool {
	var r reads
	switch {
	case g.unified != "":
		return strings.TrimSpace(r.str(g.unified, "cgroup.freeze")) == "1"
	case g.freezer != "":
		return strings.TrimSpace(r.str(g.freezer, "freezer.state")) != "THAWED"
	}
	return false
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

// stuckNote names the group's tasks in uninterruptible sleep, for an
// error message ("" if none). Call it on a thawed group: a v1 freezer's
// frozen tasks show as D too, and a thaw wakes every task for a moment,
// so the tasks are read after a short pause.
func (g *Group) stuckNote() string {
	time.Sleep(20 * time.Millisecond)
	pids, err := g.Procs()
	if err != nil {
		return ""
	}
	var stuck []string
	for _, pid := range pids {
		comm, state, ok := taskState(pid)
		if !ok || state != "D" {
			continue
		}
		wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
		stuck = append(stuck, fmt.Sprintf("%d (%s, in %s)", pid, comm, wchan))
	}
	if len(stuck) == 0 {
		return ""
	}
	if len(stuck) > 5 {
		stuck = append(stuck[:5], "…")
	}
	return "; in uninterruptible sleep: " + strings.Join(stuck, ", ")
}

// taskState reads a process's command name and state letter.
func taskState(pid int) (comm, state string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", "", false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open || end+3 > len(s) {
		return "", "", false
	}
	return s[open+1 : end], s[end+2 : end+3], true
}

// Kill SIGKILLs every task of the group and waits until the group is
// empty (its tasks may remain zombies until their parent reaps them; they
// hold no resources but a pid). With a cgroup2 group (v2 and hybrid) it
// writes cgroup.kill, which the kernel applies atomically, forks in
// flight included, even to a frozen group. On v1 it freezes the group,
// SIGKILLs each member through a pidfd (so a reused pid is never hit),
// thaws it, and repeats until the group is empty: a v1 freezer keeps a
// killed task frozen, so Kill never waits on one, and it leaves the
// group thawed however it ends. It gives up when ctx ends (or after
// 10 s), naming the tasks in uninterruptible sleep that did not die.
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
			return fmt.Errorf("killing cgroup %s: %w%s", g.name, err, g.stuckNote())
		}
		return nil
	}
	if err := writeFile(filepath.Join(g.unified, "cgroup.kill"), "1"); err != nil {
		return fmt.Errorf("killing cgroup %s: %w", g.name, err)
	}
	if err := g.waitEmpty(ctx); err != nil {
		return fmt.Errorf("killing cgroup %s: %w%s", g.name, err, g.stuckNote())
	}
	return nil
}

// KillExcept SIGKILLs every task of the group but keep and waits until
// only keep is left. The caller has frozen the group, so nothing forks
// while members are listed and signalled; each is signalled through a
// pidfd opened while it is listed, and killed is called once per pid
// signalled. On v1, where a frozen task cannot die, each round thaws the
// group for the killed tasks to go and freezes it again; the group is
// left frozen as the caller had it, or thawed if refreezing failed (the
// error says so). It fails if keep is gone (ErrGone), or when ctx ends, naming the
// tasks in uninterruptible sleep.
func (g *Group) KillExcept(ctx context.Context, keep int, killed func(pid int)) error {
	v1 := g.unified == "" && g.freezer != ""
	var seen []int
	for {
		procs, err := g.Procs()
		if err != nil {
			return err
		}
		if !slices.Contains(procs, keep) {
			return fmt.Errorf("process %d of cgroup %s: %w", keep, g.name, ErrGone)
		}
		if len(procs) == 1 {
			return nil
		}
		for _, pid := range procs {
			if pid == keep {
				continue
			}
			fd, err := sys.OpenPidfd(pid)
			if err != nil {
				continue // gone already
			}
			if !slices.Contains(seen, pid) {
				seen = append(seen, pid)
				if killed != nil {
					killed(pid)
				}
			}
			_ = fd.Kill()
			_ = fd.Close()
		}
		if v1 {
			if err := g.thaw(); err != nil {
				return fmt.Errorf("thawing cgroup %s for its killed tasks to end: %w", g.name, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("tasks of cgroup %s left: %w%s", g.name, ctx.Err(), g.stuckNote())
		case <-time.After(time.Millisecond):
		}
		if v1 {
			if err := g.Freeze(ctx); err != nil {
				return err
			}
		}
	}
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

// killV1 kills the members of the v1 group dir until it is empty, and
// leaves the group thawed.
func (g *Group) killV1(ctx context.Context, dir string) error {
	freeze := g.freezer != "" && g.unified == ""
	err := retry(ctx, func() (bool, error) {
		pids, err := readProcs(dir)
		if err != nil || len(pids) == 0 {
			return true, err
		}
		// A frozen group cannot fork while its members are listed and
		// killed (on hybrid hosts the v1 freezer is not in use).
		if freeze {
			fctx, cancel := context.WithTimeout(ctx, v1FreezeWait)
			_ = g.setFrozen(fctx, true) // a partial freeze still helps
			cancel()
		}
		err = signalMembers(dir, pids)
		if freeze {
			// Killed tasks die only once thawed.
			if terr := g.thaw(); err == nil {
				err = terr
			}
		}
		return false, err
	})
	if freeze && g.Frozen() {
		err = errors.Join(err, g.thaw())
	}
	return err
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
