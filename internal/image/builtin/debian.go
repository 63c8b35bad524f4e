package builtin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/sys"
)

// debianSuite is the Debian release of base/debian-12.
const debianSuite = "bookworm"

func debianSpec(date string) Spec {
	return Spec{
		Name: Debian12, Version: date, Role: RoleBase, Tiers: containerTiers,
		Slow: true, Dated: true,
		Fill:   fillDebian,
		recipe: 1,
	}
}

// fillDebian runs debootstrap --variant=minbase bookworm into dir from the
// host's Debian mirror (aptMirror), then empties /dev (device nodes are
// left to the runtime), adds user (1000), /workspace,
// /etc/hosts and /etc/hostname ("dsec"), drops the host's resolv.conf
// (the runtime provides one) and removes apt's caches and package lists,
// the logs and dpkg's backup files. Its output depends on the archive and
// the date: two builds are not expected to give the same layer ID.
//
// On the project's host (2 cores, deb.debian.org) it took 32 s, and the
// layer (122 MiB) 1.4 s more; budget minutes on a slow link
// (RATIONALE.md).
func fillDebian(ctx context.Context, dir string) error {
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return errors.New("needs debootstrap (scripts/deps.sh runtime installs it)")
	}
	mirror := aptMirror("/")
	if err := run(ctx, "debootstrap", "--variant=minbase", debianSuite, dir, mirror); err != nil {
		return fmt.Errorf("debootstrap from %s: %w", mirror, err)
	}
	if err := run(ctx, "chroot", dir, "useradd", "--uid", "1000", "--user-group", "--create-home", "--shell", "/bin/bash", "user"); err != nil {
		return err
	}
	t := tree{dir}
	// Layers hold no device nodes: the runtime mounts /dev.
	if err := os.RemoveAll(t.path("dev")); err != nil {
		return err
	}
	for _, d := range []string{"dev", "workspace"} {
		if err := t.dir(d, 0o755, rootID, rootID); err != nil {
			return err
		}
	}
	if err := os.Remove(t.path("etc/resolv.conf")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for name, content := range map[string]string{"etc/hosts": hostsFile, "etc/hostname": "dsec\n"} {
		os.Remove(t.path(name)) // debootstrap copies the host's
		if err := t.file(name, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return cleanDebian(dir)
}

// cleanDebian removes what an image need not carry: downloaded packages,
// apt's package lists and caches, logs (emptied, not removed, for the
// files in var/log/ that tools expect) and *-old backups.
func cleanDebian(dir string) error {
	for _, pattern := range []string{
		"var/cache/apt/archives/*.deb",
		"var/cache/apt/archives/partial/*",
		"var/cache/apt/*.bin",
		"var/lib/apt/lists/*_*",
		"var/lib/apt/lists/partial/*",
		"var/lib/dpkg/*-old",
		"var/cache/debconf/*-old",
		"var/log/apt/*",
		"var/log/bootstrap.log",
		"var/log/dpkg.log",
		"var/log/alternatives.log",
		"root/.bash_history",
	} {
		matches, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return err
		}
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	return filepath.WalkDir(filepath.Join(dir, "var/log"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		return os.Truncate(p, 0)
	})
}

// commandWait bounds the wait for a killed command's output to close.
const commandWait = 10 * time.Second

// run runs a command contained (sys.RunContained): what it mounts in the
// tree it fills (debootstrap mounts /proc and /sys there) never shows in
// the host's mount table, where a later `rm -rf` of the data directory
// would walk into the host's /proc and /sys, and goes when it ends; when
// ctx ends, it is killed with every process it started (a chrooted dpkg,
// which otherwise ran on and kept the mounts); and it dies with the
// process that runs it (kill -9 of the node). It returns its output's
// tail with the error.
func run(ctx context.Context, name string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	cmd.WaitDelay = commandWait
	if err := sys.RunContained(cmd); err != nil {
		tail := out.String()
		if len(tail) > 2000 {
			tail = "…" + tail[len(tail)-2000:]
		}
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, tail)
	}
	return nil
}
