package vmm

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/dsec-dev/dsec/internal/sys"
)

// procStat returns the state letter and start time (clock ticks after
// boot) of pid from /proc/<pid>/stat. The pair (pid, start time) names one
// process for good: a pid reused later has a later start time.
func procStat(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: fields
	// are counted after its last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); field 22 (starttime) is f[19].
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("parsing /proc/%d/stat: %w", pid, err)
	}
	return f[0][0], start, nil
}

// procAlive reports whether the process pid that started at start is still
// running (a zombie has exited: only its parent's reaping is missing).
func procAlive(pid int, start uint64) bool {
	state, st, err := procStat(pid)
	return err == nil && st == start && state != 'Z' && state != 'X'
}

// procCmdline returns the argv of pid.
func procCmdline(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), nil
}

// peerPid returns the pid of the process that created the listening socket
// conn is connected to (SO_PEERCRED).
func peerPid(conn net.Conn) (int, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return 0, fmt.Errorf("peer credentials: not a unix socket")
	}
	cred, err := sys.PeerCred(uc)
	if err != nil {
		return 0, err
	}
	return int(cred.Pid), nil
}

func sysProcAttr() *syscall.SysProcAttr {
	// A session of its own: signals for the node service's process group or
	// terminal (Ctrl-C, a service manager's stop of the main process) do
	// not reach the VM. No Pdeathsig: see the package documentation.
	return &syscall.SysProcAttr{Setsid: true}
}

// probeProcAttr is sysProcAttr for a probe VM, which, unlike a sandbox's,
// must not outlive the process that runs it: a test binary that exited
// mid-probe (a KVM kernel probe waits out its timeout here) left its QEMU
// running. The caller keeps its goroutine on the forking thread (the
// signal follows the thread).
func probeProcAttr() *syscall.SysProcAttr {
	a := sysProcAttr()
	a.Pdeathsig = syscall.SIGKILL
	return a
}
