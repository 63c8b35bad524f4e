package sys

import "syscall"

// Kill sends sig to pid (kill(2): a negative pid names a process group,
// -1 every process the caller may signal; sig 0 only checks that pid
// exists).
func Kill(pid int, sig syscall.Signal) error { return syscall.Kill(pid, sig) }

// Wait4 reaps a child that has ended (wait4(2): pid -1 is any child;
// options syscall.WNOHANG returns 0 at once if none has) and stores how
// it ended in ws.
func Wait4(pid int, ws *syscall.WaitStatus, options int) (int, error) {
	return syscall.Wait4(pid, ws, options, nil)
}

// ForkExec starts the program argv0 in a child process, as attr says,
// and returns its pid. The caller reaps it (Wait4).
func ForkExec(argv0 string, argv []string, attr *syscall.ProcAttr) (int, error) {
	return syscall.ForkExec(argv0, argv, attr)
}

// Exec replaces this process's program with argv0 (execve(2)); it
// returns only if that fails.
func Exec(argv0 string, argv, env []string) error { return syscall.Exec(argv0, argv, env) }

// Getrlimit reads this process's limit of resource (syscall.RLIMIT_*).
func Getrlimit(resource int, lim *syscall.Rlimit) error { return syscall.Getrlimit(resource, lim) }
