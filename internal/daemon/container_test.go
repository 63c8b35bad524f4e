package daemon

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// containerNames are the host-visible names of this process's container
// tier in the tests of this file: apart from internal/container's tests
// ("dc…", 10.224.0.0/12, "dsec-test-…"), the soak tests and the SDK's,
// so that test binaries running at once do not sweep each other's.
func containerNames() (testenv.Sandboxes, netip.Prefix) {
	pid := os.Getpid()
	s := testenv.Sandboxes{
		Net:          fmt.Sprintf("dd%04x", pid&0xffff),
		CgroupParent: fmt.Sprintf("dsec-dtest-%d", pid),
	}
	return s, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(240 + pid%8), 0, 0}), 16)
}

// withContainers is a startUp adjustment that turns the container tier on
// with this process's names, and lets sandboxes walk down to the data
// directory (the tier refuses one they cannot reach: see
// container.reachable). The daemon's tests run one at a time, so every
// daemon of the process can share the names.
func withContainers(t testing.TB) func(*config.Config) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the container tier needs root (namespaces, mounts, cgroups, nftables)")
	}
	names, rng := containerNames()
	return func(c *config.Config) {
		c.Container.Disabled = false
		c.Container.Name = names.Net
		c.Container.NetworkRange = rng.String()
		c.Container.CgroupParent = names.CgroupParent
		c.Container.NetworkPool = 2
		tmp := filepath.Clean(os.TempDir())
		for p := filepath.Clean(c.DataDir); strings.HasPrefix(p, tmp+"/"); p = filepath.Dir(p) {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, fi.Mode().Perm()|0o001); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// containerDataDir is a data directory for a daemon with the container
// tier, checked for nothing left on the host when the test ends (after
// the daemon stops: register it before startUp). Its path is short: an
// agent's socket, <dir>/node/container/sandboxes/<id>/sock/agent.sock,
// must fit in a unix socket address's 108 bytes, which t.TempDir's long
// names do not leave room for. Its name starts with "Test" so that
// testenv.SweepStale finds its mounts if the test is killed.
func containerDataDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "TestCt")
	if err != nil {
		t.Fatal(err)
	}
	names, _ := containerNames()
	t.Cleanup(func() {
		testenv.NoHostLeftovers(t, names)
		testenv.NoMountsUnder(t, dir)
		// The (empty) cgroup parents the tier made.
		parents, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", names.CgroupParent))
		for _, p := range append(parents, filepath.Join("/sys/fs/cgroup", names.CgroupParent)) {
			_ = os.Remove(p)
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("removing the data directory: %v", err)
		}
	})
	return dir
}

// startContainers runs `dsec up` with the container tier on, then
// applies more adjustments.
func startContainers(t testing.TB, more ...func(*config.Config)) *up {
	t.Helper()
	on := withContainers(t)
	dir := containerDataDir(t)
	return startUp(t, dir, func(c *config.Config) {
		on(c)
		for _, f := range more {
			f(c)
		}
	})
}

// sandboxCgroups returns the host directories of a sandbox's cgroups
// (one per v1 hierarchy, or the v2 one) that exist.
func sandboxCgroups(id string) []string {
	names, _ := containerNames()
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", names.CgroupParent, id))
	if d := filepath.Join("/sys/fs/cgroup", names.CgroupParent, id); isDirectory(d) {
		dirs = append(dirs, d)
	}
	return dirs
}

func isDirectory(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// cgroupValue reads the first of files (relative to /sys/fs/cgroup) that
// exists, for a sandbox: v1 names its hierarchy ("memory/…"), v2 not.
func cgroupValue(t *testing.T, id string, files ...string) string {
	t.Helper()
	names, _ := containerNames()
	for _, f := range files {
		dir, file := filepath.Split(f)
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", dir, names.CgroupParent, id, file))
		if err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	t.Fatalf("sandbox %s has none of the cgroup files %q", id, files)
	return ""
}

// commandsMemory is the memory limit of a sandbox's commands: its v1
// commands group's (cgroups.CommandsGroup), or its v2 group's.
func commandsMemory(t *testing.T, id string) string {
	t.Helper()
	names, _ := containerNames()
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", names.CgroupParent, id, "commands", "memory.limit_in_bytes")); err == nil {
		return strings.TrimSpace(string(b))
	}
	return cgroupValue(t, id, "memory.max")
}

// sandboxPids lists the host pids in a sandbox's cgroups.
func sandboxPids(id string) []int {
	seen := map[int]bool{}
	var out []int
	for _, d := range sandboxCgroups(id) {
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
	}
	return out
}

// hostCmdline is a host process's argv joined by spaces ("" if gone).
func hostCmdline(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

func mustExec(t *testing.T, c *client.Client, id string, req api.ExecRequest) *api.ExecResult {
	t.Helper()
	res, err := c.Exec(context.Background(), id, req)
	if err != nil {
		t.Fatalf("exec %q%q: %v", req.Cmd, req.Command, err)
	}
	return res
}

// TestContainerTierThroughTheAPI drives a container sandbox of the busybox
// image through the REST API and the Go client: create, exec (buffered,
// streamed, shell, stdin, env), background processes, files both ways,
// list, limits as created, as enforced on the host and as the stats
// report them (a full disk, an OOM kill), and delete, which leaves
// nothing of it on the host.
func TestContainerTierThroughTheAPI(t *testing.T) {
	u := startContainers(t)
	ctx := context.Background()
	c := u.c

	nodes, err := c.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var tier *api.TierInfo
	for i, ti := range nodes.Nodes[0].Tiers {
		if ti.Name == api.TierContainer {
			tier = &nodes.Nodes[0].Tiers[i]
		}
	}
	if tier == nil || !tier.Available {
		t.Fatalf("the node offers no available container tier: %+v", nodes.Nodes[0].Tiers)
	}

	labels := map[string]string{"test": "container-api"}
	start := time.Now()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{
		Tier: api.TierContainer, Image: "busybox", CPU: 0.5, MemoryMB: 96, DiskMB: 24,
		Labels: labels, Env: map[string]string{"GREETING": "hi"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("created %s in %s", sb.ID, time.Since(start).Round(time.Millisecond))
	if sb.Tier != api.TierContainer || sb.State != api.StateRunning || sb.Node != "test-node" ||
		!strings.HasPrefix(sb.Image, "busybox") || sb.CPU != 0.5 || sb.MemoryMB != 96 || sb.DiskMB != 24 {
		t.Errorf("created %+v", sb)
	}

	// Exec.
	if res := mustExec(t, c, sb.ID, api.ExecRequest{Cmd: []string{"echo", "hello", "world"}}); res.ExitCode != 0 || res.Stdout != "hello world\n" {
		t.Errorf("echo = %+v", res)
	}
	if res := mustExec(t, c, sb.ID, api.ExecRequest{Command: "echo $GREETING $0 | tr a-z A-Z; exit 3"}); res.ExitCode != 3 || res.Stdout != "HI /BIN/SH\n" {
		t.Errorf("a shell command line = %+v", res)
	}
	if res := mustExec(t, c, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", `cat; echo "$X in $(pwd)" >&2`}, Stdin: "in\n", Env: map[string]string{"X": "y"}, Cwd: "/tmp"}); res.Stdout != "in\n" || res.Stderr != "y in /tmp\n" {
		t.Errorf("stdin, env and cwd = %+v", res)
	}
	if res := mustExec(t, c, sb.ID, api.ExecRequest{Cmd: []string{"id", "-u"}}); res.Stdout != "0\n" {
		t.Errorf("commands run as the sandbox's root: %+v", res)
	}
	var streamed strings.Builder
	res, err := c.ExecStream(ctx, sb.ID, api.ExecRequest{Command: "for i in 1 2 3; do echo $i; done"}, func(ev api.ExecEvent) error {
		if ev.Type == api.EventStdout {
			streamed.WriteString(ev.Data)
		}
		return nil
	})
	if err != nil || res.ExitCode != 0 || streamed.String() != "1\n2\n3\n" {
		t.Errorf("streamed exec: %+v, %v, %q", res, err, streamed.String())
	}

	// A background process with stdin.
	p, err := c.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "read line; echo got $line"}})
	if err != nil {
		t.Fatal(err)
	}
	if list, err := c.ListProcesses(ctx, sb.ID); err != nil || len(list.Processes) != 1 || list.Processes[0].Pid != p.Pid {
		t.Errorf("ListProcesses = %+v, %v", list, err)
	}
	if err := c.SendStdin(ctx, sb.ID, p.Pid, "line\n"); err != nil {
		t.Fatal(err)
	}
	if res, err := c.WaitProcess(ctx, sb.ID, p.Pid, 10*time.Second); err != nil || res.ExitCode != 0 || res.Stdout != "got line\n" {
		t.Errorf("background process: %+v, %v", res, err)
	}

	// Files, both ways: the API writes what commands read, and reads what
	// they write.
	blob := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	fi, err := c.WriteFile(ctx, sb.ID, "/data/in/blob.bin", bytes.NewReader(blob), client.WriteOptions{Parents: true, Mode: 0o600})
	if err != nil || fi.Size != int64(len(blob)) || fi.Path != "/data/in/blob.bin" || fi.Mode&0o777 != 0o600 {
		t.Fatalf("WriteFile = %+v, %v", fi, err)
	}
	if res := mustExec(t, c, sb.ID, api.ExecRequest{Cmd: []string{"sha256sum", "/data/in/blob.bin"}}); !strings.HasPrefix(res.Stdout, sha256hex(blob)) {
		t.Errorf("sha256sum in the sandbox = %+v", res)
	}
	mustExec(t, c, sb.ID, api.ExecRequest{Command: "mkdir -p /data/out && seq 1 1000 > /data/out/seq.txt"})
	got, err := c.ReadFileBytes(ctx, sb.ID, "/data/out/seq.txt")
	if err != nil || !bytes.HasPrefix(got, []byte("1\n2\n")) || !bytes.HasSuffix(got, []byte("\n1000\n")) {
		t.Errorf("reading a command's file: %q, %v", got, err)
	}
	if got, err := c.ReadFileBytes(ctx, sb.ID, "/etc/hostname"); err != nil || strings.TrimSpace(string(got)) != sb.ID {
		t.Errorf("/etc/hostname = %q, %v", got, err)
	}
	if _, err := c.Rename(ctx, sb.ID, "/data/out/seq.txt", "/data/in/seq.txt"); err != nil {
		t.Error(err)
	}
	if list, err := c.ListFiles(ctx, sb.ID, "/data", 2); err != nil || len(list.Entries) != 4 {
		t.Errorf("ListFiles(/data, 2) = %+v, %v", list, err)
	}
	if err := c.RemoveFile(ctx, sb.ID, "/data/in", true); err != nil {
		t.Error(err)
	}
	if ok, err := c.Exists(ctx, sb.ID, "/data/in/blob.bin"); ok || err != nil {
		t.Errorf("Exists after a recursive remove = %v, %v", ok, err)
	}
	if _, err := c.ReadFileBytes(ctx, sb.ID, "/no/such/file"); !client.IsNotFound(err) {
		t.Errorf("reading a missing file: %v, want not found", err)
	}

	// Limits: as created, and as the host enforces them.
	if v := commandsMemory(t, sb.ID); v != strconv.Itoa(96<<20) {
		t.Errorf("memory limit on the host = %s, want %d", v, 96<<20)
	}
	if v := cgroupValue(t, sb.ID, "cpu,cpuacct/cpu.cfs_quota_us", "cpu/cpu.cfs_quota_us", "cpu.max"); v != "50000" && !strings.HasPrefix(v, "50000 ") {
		t.Errorf("CPU quota on the host = %q, want half of a 100 ms period", v)
	}
	if res := mustExec(t, c, sb.ID, api.ExecRequest{Command: "df -k / | tail -n1"}); res.ExitCode != 0 || !strings.Contains(res.Stdout, " 24576 ") {
		t.Errorf("df of the sandbox's root = %+v, want 24576 KiB", res)
	}
	// Past disk_mb, writes fail; past memory_mb, the command is killed.
	if res := mustExec(t, c, sb.ID, api.ExecRequest{Command: "dd if=/dev/zero of=/tmp/fill bs=1M count=40"}); res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left") {
		t.Errorf("writing 40 MiB to a 24 MiB disk: %+v", res)
	}
	if st, err := c.SandboxStats(ctx, sb.ID); err != nil || !st.DiskFull || st.DiskLimitBytes != 24<<20 || st.DiskBytes < 23<<20 || st.MemoryLimitBytes != 96<<20 {
		t.Errorf("stats with a full disk = %+v, %v", st, err)
	}
	mustExec(t, c, sb.ID, api.ExecRequest{Command: "rm /tmp/fill"})
	if res := mustExec(t, c, sb.ID, api.ExecRequest{Command: `x=$(head -c 200m /dev/zero | tr '\0' a); echo ${#x}`}); res.ExitCode == 0 {
		t.Errorf("a 200 MiB shell variable under a 96 MiB limit: %+v", res)
	}
	st, err := c.SandboxStats(ctx, sb.ID)
	// (The peak counts the agent's few MiB too, beside the commands'
	// memory_mb: see cgroups.CommandsGroup.)
	if err != nil || st.DiskFull || st.OOMKills < 1 || st.MemoryPeakBytes < 90<<20 || st.MemoryPeakBytes > 112<<20 || st.Processes < 1 || st.CPUSeconds <= 0 {
		t.Errorf("stats after an OOM kill = %+v, %v", st, err)
	}
	if res := mustExec(t, c, sb.ID, api.ExecRequest{Cmd: []string{"echo", "alive"}}); res.Stdout != "alive\n" {
		t.Errorf("the sandbox after an OOM kill: %+v", res)
	}
	// Defaults apply when a create names none.
	def, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "busybox", Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	if v := commandsMemory(t, def.ID); def.MemoryMB == 0 || v != strconv.Itoa(def.MemoryMB<<20) {
		t.Errorf("default memory: reported %d MiB, enforced %s bytes", def.MemoryMB, v)
	}

	// List.
	all, err := c.ListAllSandboxes(ctx, client.ListOptions{Labels: labels, Tier: api.TierContainer, State: api.StateRunning})
	if err != nil || len(all) != 2 {
		t.Errorf("ListAllSandboxes = %d sandboxes, %v", len(all), err)
	}

	// Delete: its processes, cgroups and directory go; it answers no more.
	pids := sandboxPids(sb.ID)
	if len(pids) == 0 {
		t.Fatalf("no processes in sandbox %s's cgroups", sb.ID)
	}
	sbDir := filepath.Join(u.dir, "node", "container", "sandboxes", sb.ID)
	if !isDirectory(sbDir) {
		t.Fatalf("sandbox directory %s missing: the checks below prove nothing", sbDir)
	}
	for _, id := range []string{sb.ID, def.ID} {
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	checkGone(t, u, sb.ID, pids)
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != api.StateStopped || got.Reason != "deleted" {
		t.Errorf("a deleted sandbox = %+v, %v; want stopped, deleted", got, err)
	}
	if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}); err == nil {
		t.Error("exec in a deleted sandbox succeeded")
	}
	// Cgroups only: the daemon keeps a pool of network namespaces.
	names, _ := containerNames()
	if left := testenv.Live(testenv.HostLeftovers(testenv.Sandboxes{CgroupParent: names.CgroupParent})); len(left) != 0 {
		t.Errorf("left on the host after deleting every sandbox: %q", left)
	}
}

// checkGone checks that nothing of sandbox id is left on the host: its
// processes (pids were its host pids), cgroups, mounts and directory.
func checkGone(t *testing.T, u *up, id string, pids []int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		for _, pid := range pids {
			if cmd := hostCmdline(pid); cmd != "" {
				left = append(left, fmt.Sprintf("process %d (%s)", pid, cmd))
			}
		}
		for _, d := range sandboxCgroups(id) {
			left = append(left, "cgroup "+d)
		}
		for _, m := range testenv.Mounts(t, u.dir) {
			if strings.Contains(m, id) {
				left = append(left, "mount "+m)
			}
		}
		if d := filepath.Join(u.dir, "node", "container", "sandboxes", id); isDirectory(d) {
			left = append(left, "directory "+d)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("sandbox %s left %q", id, left)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestContainerTTLExpiry checks that a container sandbox that reaches its
// time to live is destroyed: its state says so, and its processes (a
// background one included), cgroups and mounts are gone from the host.
func TestContainerTTLExpiry(t *testing.T) {
	u := startContainers(t)
	ctx := context.Background()
	sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "busybox", TimeoutS: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.c.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "1000"}}); err != nil {
		t.Fatal(err)
	}
	pids := sandboxPids(sb.ID)
	var sleeper bool
	for _, pid := range pids {
		sleeper = sleeper || hostCmdline(pid) == "sleep 1000"
	}
	if !sleeper {
		t.Fatalf("the background sleep is not among the sandbox's host processes %v", pids)
	}
	waitState(t, u.c, sb.ID, api.StateStopped, 20*time.Second)
	got, err := u.c.GetSandbox(ctx, sb.ID)
	if err != nil || got.Reason != "expired" {
		t.Errorf("expired sandbox = %+v, %v; want reason expired", got, err)
	}
	checkGone(t, u, sb.ID, pids)
}

// TestContainerLargeFileDownload reads files of a container sandbox
// through the API, past the agent's first frames.
func TestContainerLargeFileDownload(t *testing.T) {
	u := startContainers(t)
	ctx := context.Background()
	sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer u.c.DeleteSandbox(ctx, sb.ID)
	blob := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	if _, err := u.c.WriteFile(ctx, sb.ID, "/tmp/big.bin", bytes.NewReader(blob), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := u.c.ReadFileBytes(ctx, sb.ID, "/tmp/big.bin")
	if err != nil || !bytes.Equal(got, blob) {
		t.Errorf("reading 1 MiB back: %d bytes, %v", len(got), err)
	}
}

// fakeInternet is a network namespace standing for the internet beyond
// the node, reached through an uplink veth: TCP servers on its addresses
// answer "ok <client address>".
type fakeInternet struct {
	uplink string
	// public are addresses in it that policies call public; private is
	// one in 172.16.0.0/12, which needs an allow rule.
	public  []netip.Addr
	private netip.Addr
	ports   []int
	// nodePort is a port the node itself listens on, on all addresses.
	nodePort int
}

// Addresses of the fake internet: apart from those of internal/network's
// tests (203.0.113.0/30, 198.51.100.1-2, 10.99.0.1, 172.16.5.1, …), which
// may run at the same time and route theirs from the node too.
var (
	inetUplinkHost = netip.MustParsePrefix("203.0.113.253/30")
	inetUplinkPeer = netip.MustParsePrefix("203.0.113.254/30")
)

func newFakeInternet(t *testing.T) *fakeInternet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a fake internet needs root (network namespaces)")
	}
	f := &fakeInternet{
		uplink:  fmt.Sprintf("dup%04x", os.Getpid()&0xffff),
		public:  []netip.Addr{netip.MustParseAddr("198.51.100.200"), netip.MustParseAddr("198.51.100.201")},
		private: netip.MustParseAddr("172.31.213.1"),
		ports:   []int{80, 8080},
	}
	all := append(append([]netip.Addr{}, f.public...), f.private)
	ns, err := sys.NewNetns(func() error {
		lo, err := netlink.LinkByIndex(1)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		for _, a := range all {
			if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(a, 32))}); err != nil {
				return err
			}
		}
		host, err := sys.ProcessNetns()
		if err != nil {
			return err
		}
		defer host.Close()
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", Flags: net.FlagUp}, PeerName: f.uplink,
			PeerNamespace: netlink.NsFd(int(host.Fd()))}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		if err := netlink.AddrAdd(veth, &netlink.Addr{IPNet: ipNet(inetUplinkPeer)}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(veth); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: veth.Index, Gw: net.IP(inetUplinkHost.Addr().AsSlice())})
	})
	if err != nil {
		t.Fatalf("creating the fake internet: %v", err)
	}
	// Its end of the veth goes with the namespace, our end and the routes
	// through it with that.
	t.Cleanup(func() {
		ns.Close()
		if l, err := netlink.LinkByName(f.uplink); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	up, err := netlink.LinkByName(f.uplink)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(up, &netlink.Addr{IPNet: ipNet(inetUplinkHost)}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(up); err != nil {
		t.Fatal(err)
	}
	for _, a := range all {
		// On the uplink: the routes go with it.
		r := &netlink.Route{LinkIndex: up.Attrs().Index, Dst: ipNet(netip.PrefixFrom(a, 32)), Gw: net.IP(inetUplinkPeer.Addr().AsSlice())}
		if err := netlink.RouteAdd(r); err != nil {
			t.Fatalf("routing %s to the fake internet: %v", a, err)
		}
		t.Cleanup(func() { _ = netlink.RouteDel(r) })
	}
	err = sys.InNetns(ns, func() error {
		for _, p := range f.ports {
			ln, err := net.Listen("tcp4", fmt.Sprintf(":%d", p))
			if err != nil {
				return err
			}
			t.Cleanup(func() { ln.Close() })
			go serveOK(ln)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A server of the node's.
	ln, err := net.Listen("tcp4", ":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	f.nodePort = ln.Addr().(*net.TCPAddr).Port
	go serveOK(ln)
	if got, err := dialFrom(inetUplinkHost.Addr(), f.nodePort); err != nil || !strings.HasPrefix(got, "ok ") {
		t.Fatalf("the node cannot reach its own server: %q, %v", got, err)
	}
	// The proof that each server is up and routed: the node reaches it.
	for _, a := range all {
		for _, p := range f.ports {
			if got, err := dialFrom(a, p); err != nil || !strings.HasPrefix(got, "ok ") {
				t.Fatalf("the node cannot reach the fake internet's %s:%d: %q, %v", a, p, got, err)
			}
		}
	}
	return f
}

// serveOK answers every connection with "ok <client address>".
func serveOK(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		fmt.Fprintf(c, "ok %s\n", c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap())
		c.Close()
	}
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), 32)}
}

func dialFrom(a netip.Addr, port int) (string, error) {
	c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(a, uint16(port)).String(), 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// reaches reports whether sandbox id connects to a:port, by busybox nc in
// it; what the server answered tells a connection from a refusal.
func reaches(t *testing.T, c *client.Client, id string, a netip.Addr, port int) bool {
	t.Helper()
	res := mustExec(t, c, id, api.ExecRequest{Cmd: []string{"timeout", "5", "nc", a.String(), strconv.Itoa(port)}, TimeoutS: 10})
	return strings.HasPrefix(res.Stdout, "ok ")
}

// TestContainerNetworkPolicyThroughTheAPI creates container sandboxes with
// each egress mode through the API and checks what each reaches in a
// fake internet (which the node itself reaches, so every refusal is the
// policy's), and that bad policies are refused with stable codes.
func TestContainerNetworkPolicyThroughTheAPI(t *testing.T) {
	inet := newFakeInternet(t)
	u := startContainers(t, func(c *config.Config) { c.Container.Uplinks = []string{inet.uplink} })
	ctx := context.Background()

	pub, pub2, priv := inet.public[0], inet.public[1], inet.private
	for _, tc := range []struct {
		name   string
		policy *api.NetworkPolicy
		// want lists what the sandbox reaches; every other target of
		// targets it must not.
		want map[string]bool
	}{
		{"default", nil, nil},
		{"none", &api.NetworkPolicy{Egress: api.EgressNone}, nil},
		{"allowlist", &api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{
			{CIDR: pub.String(), Proto: "tcp", Ports: "80"},
		}}, map[string]bool{"pub:80": true}},
		{"allowlist-private", &api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{
			{CIDR: netip.PrefixFrom(priv, 24).Masked().String()},
		}}, map[string]bool{"priv:80": true, "priv:8080": true}},
		{"open", &api.NetworkPolicy{Egress: api.EgressOpen}, map[string]bool{"pub:80": true, "pub:8080": true, "pub2:80": true, "pub2:8080": true}},
		{"open-plus-private", &api.NetworkPolicy{Egress: api.EgressOpen, Allow: []api.NetworkRule{
			{CIDR: priv.String(), Proto: "tcp", Ports: "8080"},
		}}, map[string]bool{"pub:80": true, "pub:8080": true, "pub2:80": true, "pub2:8080": true, "priv:8080": true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "busybox", Network: tc.policy})
			if err != nil {
				t.Fatal(err)
			}
			defer u.c.DeleteSandbox(ctx, sb.ID)
			if tc.policy != nil && (sb.Network == nil || sb.Network.Egress != tc.policy.Egress) {
				t.Errorf("the sandbox reports network %+v, want %+v", sb.Network, tc.policy)
			}
			for _, tg := range []struct {
				name string
				addr netip.Addr
			}{{"pub", pub}, {"pub2", pub2}, {"priv", priv}} {
				for _, port := range inet.ports {
					key := fmt.Sprintf("%s:%d", tg.name, port)
					if got := reaches(t, u.c, sb.ID, tg.addr, port); got != tc.want[key] {
						t.Errorf("%s reaching %s (%s:%d) = %v, want %v", tc.name, key, tg.addr, port, got, tc.want[key])
					}
				}
			}
			// Never the node, whatever the policy.
			if reaches(t, u.c, sb.ID, inetUplinkHost.Addr(), inet.nodePort) {
				t.Errorf("%s reaches the node's server on its uplink address", tc.name)
			}
		})
	}

	// Bad policies: refused before anything is made.
	for _, tc := range []struct {
		name   string
		tier   string
		policy api.NetworkPolicy
		status int
		code   string
	}{
		{"unknown egress", api.TierContainer, api.NetworkPolicy{Egress: "sometimes"}, 400, "invalid_network_policy"},
		{"cidr and host", api.TierContainer, api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{{CIDR: "192.0.2.0/24", Host: "example.com"}}}, 400, "invalid_network_policy"},
		{"neither cidr nor host", api.TierContainer, api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{{Proto: "tcp"}}}, 400, "invalid_network_policy"},
		{"bad cidr", api.TierContainer, api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{{CIDR: "192.0.2.0/33"}}}, 400, "invalid_network_policy"},
		{"ipv6", api.TierContainer, api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{{CIDR: "2001:db8::/32"}}}, 400, "invalid_network_policy"},
		{"ports without proto", api.TierContainer, api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{{CIDR: "192.0.2.1", Ports: "80"}}}, 400, "invalid_network_policy"},
		{"bad proto", api.TierContainer, api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{{CIDR: "192.0.2.1", Proto: "sctp"}}}, 400, "invalid_network_policy"},
		{"bad ports", api.TierContainer, api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{{CIDR: "192.0.2.1", Proto: "tcp", Ports: "90-80"}}}, 400, "invalid_network_policy"},
		{"function open", api.TierFunction, api.NetworkPolicy{Egress: api.EgressOpen}, 422, "tier_has_no_network"},
		{"function allowlist", api.TierFunction, api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{{CIDR: "192.0.2.1"}}}, 422, "tier_has_no_network"},
	} {
		policy := tc.policy
		_, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: tc.tier, Image: imageFor(tc.tier), Network: &policy})
		var ce *client.Error
		if !errors.As(err, &ce) || ce.StatusCode != tc.status || ce.Code != tc.code {
			t.Errorf("%s: create = %v, want %d %s", tc.name, err, tc.status, tc.code)
		}
	}
	// A function sandbox may say it wants no network.
	sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierFunction, Network: &api.NetworkPolicy{Egress: api.EgressNone}})
	if err != nil {
		t.Errorf("function tier with egress none: %v", err)
	} else {
		_ = u.c.DeleteSandbox(ctx, sb.ID)
	}
	if all, err := u.c.ListAllSandboxes(ctx, client.ListOptions{State: api.StateRunning}); err != nil || len(all) != 0 {
		t.Errorf("running sandboxes after the refused creates: %+v, %v", all, err)
	}
}

func imageFor(tier string) string {
	if tier == api.TierContainer {
		return "busybox"
	}
	return ""
}
