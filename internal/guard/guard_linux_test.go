//go:build linux && amd64

package guard

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
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
	cmd := exec.Command("/bin/sh", "-c", `read x; exec /usr/bin/python3 -c "$0"`, probe)
	in, _ := cmd.StdinPipe()
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	in.Write([]byte("go\n"))
	in.Close()
	if err := cmd.Wait(); err != nil {
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
	g, err := Attach(parent, DefaultDeny, []netip.Addr{netip.MustParseAddr("169.254.169.253")})
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
