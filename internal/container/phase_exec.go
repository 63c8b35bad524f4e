package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Allowed executables (api.Phase.Executables) are enforced in the
// kernel by the node's eBPF monitor (Options.Exec): on every exec by a
// task of the sandbox's cgroup2 group, it builds the path of the file
// the kernel is about to run from its dentries and kills the task
// (SIGKILL, before the new program's first instruction) unless the path
// is allowed. The host resolves the phase's entries in the sandbox's
// mount namespace when it applies the phase: each entry is allowed as
// written and as the file (or directory) its symlinks lead to, and the
// symlinks directly in a "dir/*" directory add the files they lead to
// (those inside a "dir/**" tree do not).

// maxDirLinks bounds the symlinks of one allowed directory resolved.
const maxDirLinks = 4096

// checkEnforceable refuses a spec with allowed executables on a node
// that cannot enforce them.
func (r *Runtime) checkEnforceable(spec sandbox.Spec) error {
	for _, p := range spec.Phases {
		if p.Executables != nil && r.opt.Exec == nil {
			return errExecUnenforced(p.Name)
		}
	}
	return nil
}

func errExecUnenforced(phase string) error {
	return errdefs.New(errdefs.Unsupported, api.CodeExecutablesUnenforced,
		"phase %s names its executables, and this node cannot enforce them (its eBPF monitor does not run)", phase)
}

// setExecutables makes p's executables the only ones sb's tasks may run
// (any, without them). Preconditions: sb's processes of an earlier phase
// are gone.
func (r *Runtime) setExecutables(sb *Sandbox, p api.Phase) error {
	id := sb.cg.ID()
	if p.Executables == nil {
		if r.opt.Exec == nil || id == 0 {
			return nil
		}
		return r.opt.Exec.UnrestrictExec(id)
	}
	if r.opt.Exec == nil {
		return errExecUnenforced(p.Name)
	}
	if id == 0 {
		return errdefs.New(errdefs.Unsupported, api.CodeExecutablesUnenforced, "phase %s names its executables, and the sandbox has no cgroup2 group to enforce them on", p.Name)
	}
	pid := sb.state.Pid
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return err
	}
	defer ns.Close()
	if procs, err := sb.cg.Procs(); err != nil || !slices.Contains(procs, pid) {
		return errors.New("its agent is gone")
	}
	var (
		paths   []string
		rootDev uint64
	)
	err = sys.InMountNS(ns, func() error {
		var err error
		if rootDev, err = kernelDev("/"); err != nil {
			return err
		}
		paths = resolveExecutables(append(slices.Clone(p.Executables), "/"+GuestPath))
		return nil
	})
	if err != nil {
		return fmt.Errorf("resolving phase %s's executables: %w", p.Name, err)
	}
	return r.opt.Exec.RestrictExec(id, rootDev, paths)
}

// kernelDev is the device of the file system at path, as the kernel
// holds it (its superblock's s_dev: major << 20 | minor), which differs
// from stat's encoding.
func kernelDev(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := sys.Stat(path, &st); err != nil {
		return 0, err
	}
	d := uint64(st.Dev)
	major := (d>>8)&0xfff | (d>>32)&^uint64(0xfff)
	minor := d&0xff | (d>>12)&^uint64(0xff)
	return major<<20 | minor, nil
}

// resolveExecutables returns the paths (files, and directories as
// "dir/*" or "dir/**") that allow list: each as written and where its
// symlinks lead
// (in the calling thread's root: the sandbox's). Sandbox-made symlinks
// can only name more of the sandbox's own files.
func resolveExecutables(list []string) []string {
	var out []string
	add := func(p string) {
		if len(p) < 256 {
			out = append(out, p)
		}
	}
	for _, e := range list {
		add(e)
		if tree, ok := strings.CutSuffix(e, "/**"); ok {
			// A whole tree: where the directory's own symlinks lead. The
			// symlinks inside it are not followed (a tree has too many
			// entries to walk at each phase change): a target outside the
			// tree needs its own entry.
			if real, err := filepath.EvalSymlinks(tree); err == nil {
				add(real + "/**")
			}
			continue
		}
		dir, isDir := strings.CutSuffix(e, "/*")
		if !isDir {
			if r, err := filepath.EvalSymlinks(e); err == nil {
				add(r)
			}
			continue
		}
		real, err := filepath.EvalSymlinks(dir)
		if err != nil {
			continue
		}
		add(real + "/*")
		ents, err := os.ReadDir(real)
		if err != nil {
			continue
		}
		n := 0
		for _, de := range ents {
			if de.Type()&os.ModeSymlink == 0 {
				continue
			}
			if n++; n > maxDirLinks {
				break
			}
			if r, err := filepath.EvalSymlinks(filepath.Join(real, de.Name())); err == nil {
				add(r)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
