//go:build linux && amd64

package guard

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/dsec-dev/dsec/internal/testenv"
)

// probe is a Python script reporting, for the calls the guard refuses,
// "ok" or the errno's name.
const probe = `
import errno, socket
def attempt(name, f):
    try:
        f()
        print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
def connect4():
    s = socket.socket(); s.settimeout(0.3)
    try: s.connect(("169.254.169.254", 80))
    except socket.timeout: pass
def send4():
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("169.254.169.254", 53))
def send_dns():
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("169.254.169.253", 53))
def send_dns_other_port():
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("169.254.169.253", 80))
def send_public():
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 9))
attempt("connect-metadata", connect4)
attempt("sendto-metadata", send4)
attempt("sendto-loopback", send_public)
attempt("sendto-resolver", send_dns)
attempt("sendto-resolver-80", send_dns_other_port)
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
attempt("raw-icmp", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
`

// inGroup runs the probe (as host root) in the cgroup2 directory dir.
func inGroup(t *testing.T, dir string) map[string]string {
	t.Helper()
	return runIn(t, dir, probe)
}

// runIn runs the Python script (as host root, with args) in the cgroup2
// directory dir, or where the test runs if dir is "", and returns what
// it printed, as "name result" lines.
func runIn(t *testing.T, dir, script string, args ...string) map[string]string {
	t.Helper()
	cmd := exec.Command("/bin/sh", append([]string{"-c", `read x; exec /usr/bin/python3 -c "$0" "$@"`, script}, args...)...)
	in, _ := cmd.StdinPipe()
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if dir != "" {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			cmd.Process.Kill()
			_ = testenv.WaitCmd(t, cmd, time.Minute, "the probe to exit after SIGKILL")
			t.Fatal(err)
		}
	}
	in.Write([]byte("go\n"))
	in.Close()
	if err := testenv.WaitCmd(t, cmd, 2*time.Minute, "the probe"); err != nil {
		t.Fatalf("probe: %v\n%s", err, out.String())
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			got[k] = v
		}
	}
	return got
}

// mkgroup makes a cgroup2 directory for the test, removed at its end.
func mkgroup(t *testing.T, parts ...string) string {
	t.Helper()
	root := "/sys/fs/cgroup/unified"
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		root = "/sys/fs/cgroup"
	}
	dir := filepath.Join(append([]string{root}, parts...)...)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 100 && os.Remove(dir) != nil; i++ {
			time.Sleep(10 * time.Millisecond)
		}
	})
	return dir
}

// TestGuard: in a group under the guarded parent, even host root cannot
// reach metadata addresses or open raw IP sockets; a sibling group
// outside it can (the control); netlink, packet sockets (not inet: out of
// the hook's reach) and loopback stay usable.
func TestGuard(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("attaching cgroup-bpf needs root")
	}
	name := fmt.Sprintf("dsec-guardtest-%d", os.Getpid())
	parent := mkgroup(t, name)
	guarded := mkgroup(t, name, "sandbox")
	control := mkgroup(t, name+"-control")
	g, err := Attach(parent, Options{Deny: DefaultDeny, DNS: []netip.Addr{netip.MustParseAddr("169.254.169.253")}})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	defer g.Close()
	got := inGroup(t, guarded)
	want := map[string]string{
		"connect-metadata": "EPERM", "sendto-metadata": "EPERM", "raw-icmp": "EPERM",
		"sendto-loopback": "ok", "netlink": "ok", "sendto-resolver": "ok", "sendto-resolver-80": "EPERM",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("guarded %s: %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	ctl := inGroup(t, control)
	for _, k := range []string{"connect-metadata", "sendto-metadata", "raw-icmp"} {
		if ctl[k] == "EPERM" {
			t.Errorf("control %s: EPERM without the guard (all: %v)", k, ctl)
		}
	}
	// Detached, the guard refuses nothing.
	g.Close()
	if after := inGroup(t, guarded); after["raw-icmp"] != "ok" {
		t.Errorf("after Close: %v", after)
	}
}

// devProbe tries the device accesses the guard rules on: argv[1] is a
// block device node, argv[2] a directory to make nodes in.
const devProbe = `
import errno, os, sys
def attempt(name, f):
    try:
        f()
        print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
def read(path, n=1):
    fd = os.open(path, os.O_RDONLY)
    try: os.read(fd, n)
    finally: os.close(fd)
def pty():
    m, s = os.openpty()
    os.write(s, b"x")
    os.close(m); os.close(s)
def mknod(name, kind, major, minor):
    p = os.path.join(sys.argv[2], name)
    try: os.mknod(p, kind | 0o600, os.makedev(major, minor))
    finally:
        if os.path.lexists(p): os.unlink(p)
attempt("block", lambda: os.close(os.open(sys.argv[1], os.O_RDONLY)))
attempt("null", lambda: read("/dev/null"))
attempt("zero", lambda: read("/dev/zero"))
attempt("urandom", lambda: read("/dev/urandom", 16))
attempt("pty", pty)
attempt("mknod-null", lambda: mknod("null", 0o020000, 1, 3))
attempt("mknod-whiteout", lambda: mknod("wh", 0o020000, 0, 0))
attempt("fifo", lambda: mknod("fifo", 0o010000, 0, 0))
`

// blockNode makes, in a fresh directory, a node of a block device the
// test (outside any guard) can open, and returns its path and the
// directory.
func blockNode(t *testing.T) (node, dir string) {
	t.Helper()
	dir = t.TempDir()
	node = filepath.Join(dir, "blk")
	devs, _ := os.ReadDir("/sys/dev/block")
	for _, d := range devs {
		var major, minor int
		if _, err := fmt.Sscanf(d.Name(), "%d:%d", &major, &minor); err != nil {
			continue
		}
		dev := major<<8 | minor&0xff | (minor&^0xff)<<12
		if err := syscall.Mknod(node, syscall.S_IFBLK|0o600, dev); err != nil {
			t.Fatal(err)
		}
		if fd, err := syscall.Open(node, syscall.O_RDONLY|syscall.O_CLOEXEC, 0); err == nil {
			syscall.Close(fd)
			return node, dir
		}
		os.Remove(node)
	}
	t.Skip("no block device this test may open")
	return "", ""
}

// TestDevices: in a group under the guarded parent, even host root opens
// only the devices of a sandbox's /dev and makes no device node; outside
// it (the control), the same calls succeed.
func TestDevices(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("attaching cgroup-bpf needs root")
	}
	node, dir := blockNode(t)
	name := fmt.Sprintf("dsec-guardtest-dev-%d", os.Getpid())
	parent := mkgroup(t, name)
	guarded := mkgroup(t, name, "sandbox")
	g, err := Attach(parent, Options{})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	defer g.Close()
	got := runIn(t, guarded, devProbe, node, dir)
	want := map[string]string{
		"block": "EPERM", "mknod-null": "EPERM",
		"null": "ok", "zero": "ok", "urandom": "ok", "pty": "ok",
		// Not devices the hook sees: overlayfs whiteouts and FIFOs.
		"mknod-whiteout": "ok", "fifo": "ok",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("guarded %s: %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	ctl := runIn(t, "", devProbe, node, dir)
	for _, k := range []string{"block", "mknod-null"} {
		if ctl[k] != "ok" {
			t.Errorf("control %s: %q without the guard (all: %v)", k, ctl[k], ctl)
		}
	}
}

// TestPinned: pinned, the guard outlives its Guard (Keep) and still
// refuses; the next Attach takes the same links over (their programs
// replaced in place, not attached twice); one for another directory
// moves them there; Close leaves no program and no pin.
func TestPinned(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("attaching cgroup-bpf needs root")
	}
	name := fmt.Sprintf("dsec-guardtest-pin-%d", os.Getpid())
	parent := mkgroup(t, name)
	guarded := mkgroup(t, name, "sandbox")
	other := mkgroup(t, name+"-other")
	pins := PinDir(fmt.Sprintf("gt%d", os.Getpid()))
	t.Cleanup(func() {
		if err := Remove(pins); err != nil {
			t.Error(err)
		}
	})
	attached := func(dir string, want []string) {
		t.Helper()
		got, err := Attached(dir)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("attached to %s: %q, want %q", dir, got, want)
		}
	}
	linkIDs := func() []link.ID {
		t.Helper()
		var ids []link.ID
		for _, n := range ProgramNames() {
			l, err := link.LoadPinnedLink(filepath.Join(pins, n), nil)
			if err != nil {
				t.Fatal(err)
			}
			info, err := l.Info()
			l.Close()
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, info.ID)
		}
		return ids
	}

	g, err := Attach(parent, Options{Deny: DefaultDeny, PinDir: pins})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	attached(parent, ProgramNames())
	first := linkIDs()
	// A pin an older agent left, of something this one has no use for.
	stray, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := stray.Pin(filepath.Join(pins, "stray")); err != nil {
		t.Fatal(err)
	}
	stray.Close()
	if err := g.Keep(); err != nil {
		t.Fatal(err)
	}
	attached(parent, ProgramNames())
	if got := inGroup(t, guarded); got["raw-icmp"] != "EPERM" || got["connect-metadata"] != "EPERM" {
		t.Errorf("kept guard refuses nothing: %v", got)
	}

	// The next agent takes the links over.
	g, err = Attach(parent, Options{Deny: DefaultDeny, PinDir: pins})
	if err != nil {
		t.Fatalf("Attach again: %v", err)
	}
	attached(parent, ProgramNames())
	if again := linkIDs(); !slices.Equal(again, first) {
		t.Errorf("links %v after the second Attach, want the pinned %v", again, first)
	}
	if _, err := os.Stat(filepath.Join(pins, "stray")); !os.IsNotExist(err) {
		t.Errorf("stray pin after Attach: %v", err)
	}
	g.Keep()

	// Pinned for another directory: replaced, and detached from the first.
	g, err = Attach(other, Options{PinDir: pins})
	if err != nil {
		t.Fatalf("Attach elsewhere: %v", err)
	}
	attached(parent, nil)
	attached(other, ProgramNames())
	if moved := linkIDs(); slices.ContainsFunc(moved, func(id link.ID) bool { return slices.Contains(first, id) }) {
		t.Errorf("links %v kept the first directory's %v", moved, first)
	}

	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	attached(other, nil)
	if _, err := os.Stat(pins); !os.IsNotExist(err) {
		t.Errorf("pin directory after Close: %v", err)
	}
}
