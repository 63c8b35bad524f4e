package testenv

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/google/nftables"
)

// Proc is one process as /proc shows it.
type Proc struct {
	Pid, PPid int
	UID       int    // real uid
	State     byte   // 'S', 'R', 'Z', …
	Cmdline   string // argv joined by spaces
	Cgroups   string // /proc/<pid>/cgroup, one line per hierarchy
}

func (p Proc) String() string {
	return fmt.Sprintf("pid %d (ppid %d, uid %d, state %c): %s", p.Pid, p.PPid, p.UID, p.State, p.Cmdline)
}

// Procs lists the host's processes; those that exit while being read are
// left out.
func Procs() []Proc {
	ents, _ := os.ReadDir("/proc")
	var out []Proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readProc(pid); ok {
			out = append(out, p)
		}
	}
	return out
}

func readProc(pid int) (Proc, bool) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return Proc{}, false
	}
	p := Proc{Pid: pid}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		switch k {
		case "State":
			p.State = f[0][0]
		case "PPid":
			p.PPid, _ = strconv.Atoi(f[0])
		case "Uid":
			p.UID, _ = strconv.Atoi(f[0])
		}
	}
	cmd, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
	p.Cmdline = string(bytes.TrimRight(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}), " "))
	cg, _ := os.ReadFile(filepath.Join(dir, "cgroup"))
	p.Cgroups = string(cg)
	return p, true
}

// SandboxProcs lists the processes that belong to sandboxes: those
// running as a host uid in [uidBase, uidBase+uidCount) (the sandboxes' id
// map; zero uidCount skips this), or in a cgroup below the parent named
// cgroupParent in any hierarchy (empty skips this). Zombies are included:
// a sandbox process nobody reaps is a leak too.
func SandboxProcs(uidBase, uidCount int, cgroupParent string) []Proc {
	var out []Proc
	for _, p := range Procs() {
		inRange := uidCount > 0 && p.UID >= uidBase && p.UID < uidBase+uidCount
		inGroup := cgroupParent != "" && inCgroupParent(p.Cgroups, cgroupParent)
		if inRange || inGroup {
			out = append(out, p)
		}
	}
	return out
}

// inCgroupParent reports whether a /proc/<pid>/cgroup text places the
// process in a group below parent (a top-level cgroup name).
func inCgroupParent(cgroups, parent string) bool {
	for _, line := range strings.Split(cgroups, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && strings.HasPrefix(parts[2], "/"+parent+"/") {
			return true
		}
	}
	return false
}

// NftElements counts the elements of each set of the nftables table inet
// name (interval sets count both ends of each interval). It returns nil
// and no error if the table does not exist.
func NftElements(name string) (map[string]int, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	tab, err := c.ListTableOfFamily(name, nftables.TableFamilyINet)
	if err != nil || tab == nil {
		return nil, nil
	}
	sets, err := c.GetSets(tab)
	if err != nil {
		return nil, fmt.Errorf("listing the sets of table inet %s: %w", name, err)
	}
	out := make(map[string]int, len(sets))
	for _, s := range sets {
		es, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("listing set %s of table inet %s: %w", s.Name, name, err)
		}
		out[s.Name] = len(es)
	}
	return out, nil
}

// nftTable finds the nftables table inet name (nil if there is none).
func nftTable(c *nftables.Conn, name string) (*nftables.Table, error) {
	tabs, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("listing nftables tables: %w", err)
	}
	for _, t := range tabs {
		if t.Name == name {
			return t, nil
		}
	}
	return nil, nil
}

// NftHasAddr reports whether an element of a set of the nftables table
// inet name holds the IPv4 address addr in its key (alone or as part of
// a concatenation); false if the table does not exist.
func NftHasAddr(name string, addr netip.Addr) (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, err
	}
	tab, err := nftTable(c, name)
	if err != nil || tab == nil {
		return false, err
	}
	sets, err := c.GetSets(tab)
	if err != nil {
		return false, fmt.Errorf("listing the sets of table inet %s: %w", name, err)
	}
	want := addr.AsSlice()
	for _, s := range sets {
		es, err := c.GetSetElements(s)
		if err != nil {
			return false, fmt.Errorf("listing set %s of table inet %s: %w", s.Name, name, err)
		}
		for _, e := range es {
			if bytes.Contains(e.Key, want) || bytes.Contains(e.KeyEnd, want) {
				return true, nil
			}
		}
	}
	return false, nil
}

// NftTableExists reports whether the nftables table inet name exists.
func NftTableExists(name string) (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, err
	}
	tab, err := nftTable(c, name)
	return tab != nil, err
}
