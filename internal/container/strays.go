package container

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dsec-dev/dsec/internal/guest/setup"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Strays. The cgroup sweep of Recover finds what ran in a sandbox's
// cgroups; a first process that never joined them (its create failed
// between the fork and the join, or the node died there) is in none of
// them, and was once found alive 45 minutes after its create failed, in
// the host's root cgroups. A stray is recognised by what it is instead:
// PID 1 of a pid namespace of its own, running as one of this node's ids
// (the sandboxes' range, HostUID to HostUID+IDCount-1), with this node's
// mark in its environment (setup.NodeEnv: another node on the host with
// the same range has another mark). A first process of a node from
// before the mark is recognised by its console log, fd 1, in this node's
// state directory.

// sweepStrays kills this node's sandbox first processes that are not
// keep's (the adopted sandboxes' pids) and waits for them to go; it
// returns their pids.
func (r *Runtime) sweepStrays(keep map[int]bool) []int {
	consoles, err := filepath.Abs(filepath.Join(r.opt.StateDir, "sandboxes"))
	if err != nil {
		r.log.Warn("listing processes for strays", "err", err)
		return nil
	}
	consoles += "/"
	ents, err := os.ReadDir("/proc")
	if err != nil {
		r.log.Warn("listing processes for strays", "err", err)
		return nil
	}
	var killed []int
	var fds []*sys.Pidfd
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || keep[pid] || !r.isStray(pid, consoles) {
			continue
		}
		fd, err := sys.OpenPidfd(pid)
		if err != nil {
			continue // gone
		}
		// The pidfd holds this process: check it again, the pid may have
		// been reused between the look and the open.
		if !r.isStray(pid, consoles) {
			fd.Close()
			continue
		}
		if err := fd.Kill(); err != nil {
			r.log.Warn("killing a stray sandbox process", "pid", pid, "err", err)
		}
		r.log.Warn("killed a sandbox process no sandbox owns", "pid", pid)
		killed = append(killed, pid)
		fds = append(fds, fd)
	}
	for i, fd := range fds {
		if err := fd.Wait(killWait); err != nil {
			r.log.Warn("a stray sandbox process outlived its kill", "pid", killed[i], "err", err)
		}
		fd.Close()
	}
	return killed
}

// isStray reports whether pid looks like a first process this node
// forked (see above); consoles is the directory of this node's
// sandboxes, with a trailing slash.
func (r *Runtime) isStray(pid int, consoles string) bool {
	dir := "/proc/" + strconv.Itoa(pid)
	status, err := os.ReadFile(dir + "/status")
	if err != nil {
		return false
	}
	uid, nspid := "", ""
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				uid = f[0] // the real uid, as the host sees it
			}
		} else if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			nspid = v
		}
	}
	u, err := strconv.Atoi(uid)
	if err != nil || u < r.opt.HostUID || u >= r.opt.HostUID+r.opt.IDCount {
		return false
	}
	// PID 1 of a pid namespace below the host's.
	if f := strings.Fields(nspid); len(f) < 2 || f[len(f)-1] != "1" {
		return false
	}
	env, err := os.ReadFile(dir + "/environ")
	if err != nil {
		return false
	}
	marked := false
	for kv := range bytes.SplitSeq(env, []byte{0}) {
		if k, v, ok := bytes.Cut(kv, []byte{'='}); ok && string(k) == setup.NodeEnv {
			if string(v) != r.node {
				return false // another node's
			}
			marked = true
		}
	}
	if marked {
		return true
	}
	console, err := os.Readlink(dir + "/fd/1")
	return err == nil && strings.HasPrefix(console, consoles)
}
