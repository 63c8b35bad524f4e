package network

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/dsec-dev/dsec/internal/sys"
)

// The test binary doubles as a probe: run with helperEnv set, TestMain
// runs runHelper instead of the tests.
const helperEnv = "DSEC_NETTEST_HELPER"

// Checks of the "caps" probe. admin* need CAP_NET_ADMIN or CAP_NET_RAW
// over the namespace; the others must work for sandbox root.
var (
	adminChecks = []string{"link_set", "addr_add", "route_add", "neigh_add", "nft_table", "sysctl_write", "raw_socket", "packet_socket"}
	userChecks  = []string{"link_list", "bind_low_port", "ping_socket"}
)

// runHelper runs a probe in this process and prints its result as JSON.
func runHelper(mode string, _ []string) int {
	if mode != "caps" {
		fmt.Fprintf(os.Stderr, "unknown helper mode %q\n", mode)
		return 2
	}
	res := map[string]string{}
	check := func(name string, err error) {
		if err == nil {
			res[name] = "ok"
		} else {
			res[name] = err.Error()
		}
	}
	h, err := netlink.NewHandle(sys.NetlinkRoute)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	eth0, err := h.LinkByName("eth0")
	check("link_list", err)
	if err != nil {
		json.NewEncoder(os.Stdout).Encode(res)
		return 0
	}
	idx := eth0.Attrs().Index
	// Changes that leave the namespace as it was if they succeed.
	check("link_set", h.LinkSetTxQLen(eth0, eth0.Attrs().TxQLen))
	probeNet := hostNet(testRange.Addr().Next().Next().Next()) // inside the sandbox range: not routed anywhere real
	a := &netlink.Addr{IPNet: probeNet}
	if err := h.AddrAdd(eth0, a); err == nil {
		check("addr_add", h.AddrDel(eth0, a))
	} else {
		check("addr_add", err)
	}
	r := &netlink.Route{LinkIndex: idx, Dst: hostNet(inetPublic2), Scope: netlink.SCOPE_LINK}
	if err := h.RouteAdd(r); err == nil {
		check("route_add", h.RouteDel(r))
	} else {
		check("route_add", err)
	}
	n := &netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: probeNet.IP, HardwareAddr: hostMAC}
	if err := h.NeighAdd(n); err == nil {
		check("neigh_add", h.NeighDel(n))
	} else {
		check("neigh_add", err)
	}
	if c, err := nftables.New(); err != nil {
		check("nft_table", err)
	} else {
		t := c.AddTable(&nftables.Table{Name: "probe", Family: nftables.TableFamilyINet})
		if err := c.Flush(); err == nil {
			c.DelTable(t)
			check("nft_table", c.Flush())
		} else {
			check("nft_table", err)
		}
	}
	check("sysctl_write", os.WriteFile("/proc/sys/net/ipv4/ip_unprivileged_port_start", []byte("0"), 0))
	check("raw_socket", socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_ICMP))
	check("packet_socket", socket(syscall.AF_PACKET, syscall.SOCK_RAW, 0x0300)) // htons(ETH_P_ALL)
	check("ping_socket", socket(syscall.AF_INET, syscall.SOCK_DGRAM, syscall.IPPROTO_ICMP))
	if ln, err := net.Listen("tcp4", ":80"); err == nil {
		ln.Close()
		check("bind_low_port", nil)
	} else {
		check("bind_low_port", err)
	}
	h.Close()
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

func socket(domain, typ, proto int) error {
	fd, err := syscall.Socket(domain, typ, proto)
	if err == nil {
		syscall.Close(fd)
	}
	return err
}

var (
	helperOnce sync.Once
	helperPath string
	helperErr  error
)

// helperBinary returns a copy of the test binary that an unprivileged
// user (a sandbox's root, mapped to uid 100000) can execute.
func helperBinary(t testing.TB) string {
	t.Helper()
	helperOnce.Do(func() {
		exe, err := os.Executable()
		if err != nil {
			helperErr = err
			return
		}
		dir, err := os.MkdirTemp("", "dsec-nettest-")
		if err != nil {
			helperErr = err
			return
		}
		if helperErr = os.Chmod(dir, 0o755); helperErr != nil {
			return
		}
		helperPath = filepath.Join(dir, "probe")
		helperErr = copyFile(exe, helperPath)
	})
	if helperErr != nil {
		t.Fatalf("copying the probe binary: %v", helperErr)
	}
	return helperPath
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// removeHelper deletes the probe binary's directory (TestMain, at exit).
func removeHelper() {
	if helperPath != "" {
		os.RemoveAll(filepath.Dir(helperPath))
	}
}

// probeCaps runs the "caps" probe in the namespace at netns: as a
// sandbox's root (root of a new user namespace, mapped to uid 100000) or,
// as the proof that the probe can see success, as the node's root.
func probeCaps(t testing.TB, netns string, sandboxRoot bool) map[string]string {
	t.Helper()
	bin := helperBinary(t)
	var out []byte
	err := EnterNetns(netns, func() error {
		cmd := exec.Command(bin)
		cmd.Env = []string{helperEnv + "=caps"}
		cmd.Stderr = os.Stderr
		if sandboxRoot {
			cmd.SysProcAttr = &syscall.SysProcAttr{
				Cloneflags:  syscall.CLONE_NEWUSER,
				UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}},
				GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}},
				Credential:  &syscall.Credential{Uid: 0, Gid: 0},
			}
		}
		var err error
		out, err = cmd.Output()
		return err
	})
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	res := map[string]string{}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("probe output %q: %v", out, err)
	}
	return res
}
