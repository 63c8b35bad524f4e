package builtin

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
)

// busyboxBinary is where Debian's busybox-static package installs busybox.
const busyboxBinary = "/bin/busybox"

// errNoBusybox says how to get busybox-static.
var errNoBusybox = errors.New("needs Debian's busybox-static package (scripts/deps.sh runtime installs it)")

func busyboxSpec() Spec {
	s := Spec{
		Name: Busybox, Role: RoleBase, Tiers: containerTiers,
		Fill:   fillBusybox,
		recipe: 1,
	}
	out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "busybox-static").Output()
	if v := strings.TrimSpace(string(out)); err == nil && v != "" {
		s.Version = v
	} else {
		s.err = errNoBusybox
	}
	return s
}

// busyboxDirs are the directories of base/busybox besides those of its
// applets: mode, owner.
var busyboxDirs = []struct {
	name     string
	mode     os.FileMode
	uid, gid int
}{
	{"bin", 0o755, rootID, rootID},
	{"dev", 0o755, rootID, rootID},
	{"etc", 0o755, rootID, rootID},
	{"home", 0o755, rootID, rootID},
	{"home/user", 0o755, userID, userID},
	{"proc", 0o555, rootID, rootID},
	{"root", 0o700, rootID, rootID},
	{"run", 0o755, rootID, rootID},
	{"sbin", 0o755, rootID, rootID},
	{"sys", 0o555, rootID, rootID},
	{"tmp", os.ModeSticky | 0o777, rootID, rootID},
	{"usr", 0o755, rootID, rootID},
	{"usr/bin", 0o755, rootID, rootID},
	{"usr/sbin", 0o755, rootID, rootID},
	{"var", 0o755, rootID, rootID},
	{"var/tmp", os.ModeSticky | 0o777, rootID, rootID},
	{"workspace", 0o755, rootID, rootID},
}

// busyboxNsswitch is /etc/nsswitch.conf: busybox's libc-free applets read
// the files directly; the file is there for programs added on top.
const busyboxNsswitch = `passwd:         files
group:          files
shadow:         files
hosts:          files dns
networks:       files
protocols:      files
services:       files
`

// fillBusybox writes a minimal root: the host's static busybox at
// /bin/busybox, a relative symbolic link per applet where busybox
// --list-full puts it (/bin/sh, /usr/bin/awk…), accounts root and user
// (1000), /etc/hosts, /etc/nsswitch.conf, /tmp (1777) and the mount
// points /proc, /sys, /dev, /workspace. Everything is owned by root but
// /home/user (1000:1000).
func fillBusybox(ctx context.Context, dir string) error {
	prog, err := os.ReadFile(busyboxBinary)
	if err != nil {
		return fmt.Errorf("%w: %w", errNoBusybox, err)
	}
	if err := checkStatic(busyboxBinary); err != nil {
		return fmt.Errorf("%w: %w", errNoBusybox, err)
	}
	out, err := exec.CommandContext(ctx, busyboxBinary, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("listing busybox applets: %w", err)
	}
	applets, err := parseApplets(out)
	if err != nil {
		return err
	}
	t := tree{dir}
	for _, d := range busyboxDirs {
		if err := t.dir(d.name, d.mode, d.uid, d.gid); err != nil {
			return err
		}
	}
	if err := t.file("bin/busybox", prog, 0o755); err != nil {
		return err
	}
	for _, a := range applets {
		if err := t.symlink(relTo(path.Dir(a), "bin/busybox"), a); err != nil {
			return err
		}
	}
	etc := accountFiles("/bin/sh")
	etc["etc/hosts"] = hostsFile
	etc["etc/nsswitch.conf"] = busyboxNsswitch
	for _, name := range sortedKeys(etc) {
		if err := t.file(name, []byte(etc[name]), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// parseApplets reads busybox --list-full: one path per line, relative to
// the root ("usr/bin/awk"). It returns them sorted, without busybox
// itself and the ones at the root (linuxrc).
func parseApplets(out []byte) ([]string, error) {
	var applets []string
	for _, line := range strings.Split(string(out), "\n") {
		a := strings.TrimSpace(line)
		if a == "" || a == "bin/busybox" || !strings.Contains(a, "/") {
			continue
		}
		if path.Clean(a) != a || path.IsAbs(a) || strings.HasPrefix(a, "../") {
			return nil, fmt.Errorf("busybox --list-full: unexpected applet path %q", a)
		}
		applets = append(applets, a)
	}
	if len(applets) == 0 {
		return nil, errors.New("busybox --list-full listed no applets")
	}
	slices.Sort(applets)
	return slices.Compact(applets), nil
}

// relTo returns the path of target relative to directory from, both
// relative to the same root.
func relTo(from, target string) string {
	up := ""
	for d := from; d != "." && d != ""; d = path.Dir(d) {
		up += "../"
	}
	return up + target
}

// checkStatic fails if the ELF file at p asks for a dynamic loader.
func checkStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked", p)
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
