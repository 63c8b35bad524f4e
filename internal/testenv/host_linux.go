package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
)

// Sandboxes names what a test's container sandboxes put on the host: the
// network instance name (netns files, veths and the nftables table carry
// it), the cgroup parent and, if set, the cgroup-bpf guard's pin
// directory (guard.PinDir of the network name).
type Sandboxes struct {
	Net, CgroupParent string
	GuardPins         string
}

// HostLeftovers lists what of s is on the host: network namespaces,
// links, the nftables table, cgroups below the parent in any hierarchy
// (empty ones kept for reuse as "kept-cgroup"), processes in them, and
// the guard's pins ("bpf-pin", its empty directory "bpf-pin-dir").
func HostLeftovers(s Sandboxes) []string {
	var out []string
	if s.GuardPins != "" {
		if ents, err := os.ReadDir(s.GuardPins); err == nil {
			for _, e := range ents {
				out = append(out, "bpf-pin "+filepath.Join(s.GuardPins, e.Name()))
			}
			if len(ents) == 0 {
				out = append(out, "bpf-pin-dir "+s.GuardPins)
			}
		}
	}
	if s.Net != "" {
		if ents, err := os.ReadDir("/run/netns"); err == nil {
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), s.Net+"-") {
					out = append(out, "netns "+e.Name())
				}
			}
		}
		if ents, err := os.ReadDir("/sys/class/net"); err == nil {
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), s.Net) {
					out = append(out, "link "+e.Name())
				}
			}
		}
		if c, err := nftables.New(); err == nil {
			if tab, err := c.ListTableOfFamily(s.Net, nftables.TableFamilyINet); err == nil && tab != nil {
				out = append(out, "nftables table inet "+s.Net)
			}
		}
	}
	if s.CgroupParent != "" {
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", s.CgroupParent))
		if d := filepath.Join("/sys/fs/cgroup", s.CgroupParent); isDir(d) {
			dirs = append(dirs, d)
		}
		for _, d := range dirs {
			ents, _ := os.ReadDir(d)
			for _, e := range ents {
				if !e.IsDir() {
					continue
				}
				b, err := os.ReadFile(filepath.Join(d, e.Name(), "cgroup.procs"))
				busy := err == nil && len(strings.TrimSpace(string(b))) > 0
				// An empty group the cgroup manager keeps for reuse
				// (cgroups.Manager.Recycle) belongs to no sandbox; a live
				// node may have some, a closed one none.
				if strings.HasPrefix(e.Name(), "kept-") && !busy {
					out = append(out, "kept-cgroup "+filepath.Join(d, e.Name()))
					continue
				}
				// A warm sandbox (container.Options.Warm) is the node's
				// until a create claims it.
				kind := "cgroup "
				if strings.HasPrefix(e.Name(), "warm-") {
					kind = "warm-cgroup "
				}
				out = append(out, kind+filepath.Join(d, e.Name()))
				if busy {
					out = append(out, "processes "+strings.Join(strings.Fields(string(b)), ",")+" in "+filepath.Join(d, e.Name()))
				}
			}
		}
	}
	return out
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// NoHostLeftovers fails the test if anything of s is still on the host
// after a grace period for the kernel's asynchronous teardown (netns and
// veth removal finish after the call that asked for it).
func NoHostLeftovers(t testing.TB, s Sandboxes) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		left := HostLeftovers(s)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("left on the host: %q", left)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Live drops from leftovers what a running node may hold with no sandbox:
// empty cgroups kept for reuse, warm sandboxes' cgroups and processes,
// and the guard's pins.
func Live(leftovers []string) []string {
	var out []string
	for _, l := range leftovers {
		warm := strings.Contains(l, "/warm-") && (strings.HasPrefix(l, "warm-cgroup ") || strings.HasPrefix(l, "processes "))
		pin := strings.HasPrefix(l, "bpf-pin ") || strings.HasPrefix(l, "bpf-pin-dir ")
		if !warm && !pin && !strings.HasPrefix(l, "kept-cgroup ") {
			out = append(out, l)
		}
	}
	return out
}
