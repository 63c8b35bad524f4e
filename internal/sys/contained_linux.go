package sys

import (
	"fmt"
	"os/exec"
	"runtime"
	"syscall"
)

// RunContained runs cmd (made by exec.Command or exec.CommandContext, not
// yet started) to its end in a mount namespace and a PID namespace of its
// own, for a tool that mounts things and forks helpers (debootstrap
// mounts /proc and /sys in the tree it fills and runs dpkg chrooted
// there):
//
//   - every mount in the namespace is private: the host's mount table
//     never shows what cmd mounts, so nothing walking the host's tree
//     (an `rm -rf` of the directory) can reach into it, and the mounts
//     go with the namespace's last process;
//   - cmd's program is the PID namespace's init: when it ends or is
//     killed, the kernel kills every process it left, wherever they
//     chrooted;
//   - all of it is killed when cmd's context ends (exec.CommandContext)
//     and when the calling process dies.
//
// The namespaces are made by util-linux's unshare(1), which cmd runs
// through (its Path and Args are rewritten): this process's threads never
// leave the host's namespaces. unshare forks the program and kills it
// with SIGKILL when it dies itself (--kill-child), and unshare gets
// SIGKILL when this process dies (Pdeathsig). It returns cmd.Wait's error.
func RunContained(cmd *exec.Cmd) error {
	if cmd.Err != nil {
		return cmd.Err
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return fmt.Errorf("running %s contained needs unshare (Debian util-linux): %w", cmd.Path, err)
	}
	cmd.Args = append([]string{"unshare", "--mount", "--propagation=private", "--pid", "--kill-child=SIGKILL", "--", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = unshare
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	// Pdeathsig fires when the thread that forked ends, not the process,
	// and Go ends a thread whose locked goroutine exits: keep this one
	// locked (it is not otherwise changed) until cmd has ended.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Wait()
}
