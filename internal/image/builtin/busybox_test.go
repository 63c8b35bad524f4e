package builtin

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestBusyboxTree(t *testing.T) {
	needRoot(t)
	dir := fill(t, spec(t, Busybox))
	entries := walk(t, dir)
	out, err := exec.Command(busyboxBinary, "--list-full").Output()
	if err != nil {
		t.Fatal(err)
	}
	applets, err := parseApplets(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range applets {
		e, ok := entries[a]
		if !ok || e.mode&fs.ModeSymlink == 0 {
			t.Errorf("applet %s: %+v, want a symlink", a, e)
			continue
		}
		if got, err := filepath.EvalSymlinks(filepath.Join(dir, a)); err != nil || got != filepath.Join(dir, "bin/busybox") {
			t.Errorf("applet %s → %q resolves to %q (%v)", a, e.link, got, err)
		}
	}
	for _, a := range []string{"bin/sh", "usr/bin/env", "bin/ls"} {
		if _, ok := entries[a]; !ok {
			t.Errorf("no %s", a)
		}
	}
	want := map[string]entry{
		"bin/busybox":       {mode: 0o755},
		"etc/passwd":        {mode: 0o644},
		"etc/group":         {mode: 0o644},
		"etc/hosts":         {mode: 0o644},
		"etc/nsswitch.conf": {mode: 0o644},
		"tmp":               {mode: fs.ModeDir | fs.ModeSticky | 0o777},
		"var/tmp":           {mode: fs.ModeDir | fs.ModeSticky | 0o777},
		"root":              {mode: fs.ModeDir | 0o700},
		"home/user":         {mode: fs.ModeDir | 0o755, uid: 1000, gid: 1000},
		"proc":              {mode: fs.ModeDir | 0o555},
		"sys":               {mode: fs.ModeDir | 0o555},
		"dev":               {mode: fs.ModeDir | 0o755},
		"workspace":         {mode: fs.ModeDir | 0o755},
	}
	for name, w := range want {
		if got := entries[name]; got != w {
			t.Errorf("%s: %+v, want %+v", name, got, w)
		}
	}
	for name, e := range entries {
		if _, ok := want[name]; !ok && (e.uid != 0 || e.gid != 0) {
			t.Errorf("%s owned by %d:%d, want root", name, e.uid, e.gid)
		}
	}
	if got, want := len(entries), len(applets)+len(want)+len([]string{"bin", "etc", "home", "run", "sbin", "usr", "usr/bin", "usr/sbin", "var"}); got != want {
		t.Errorf("%d entries, want %d", got, want)
	}
	prog, _ := os.ReadFile(busyboxBinary)
	if b, _ := os.ReadFile(filepath.Join(dir, "bin/busybox")); !bytes.Equal(b, prog) {
		t.Error("bin/busybox differs from the host's")
	}
}

// TestBusyboxLayer mounts the layer and runs its busybox from the host
// (busybox-static runs anywhere; no chroot).
func TestBusyboxLayer(t *testing.T) {
	needRoot(t)
	art, err := Ensure(context.Background(), t.TempDir(), spec(t, Busybox), nil)
	if err != nil {
		t.Fatal(err)
	}
	mnt := mount(t, art)
	for _, tc := range []struct {
		name string
		argv []string
		want string
	}{
		{name: "busybox", argv: []string{"bin/busybox", "echo", "hi"}, want: "hi\n"},
		{name: "sh applet", argv: []string{"bin/sh", "-c", "echo from sh"}, want: "from sh\n"},
		{name: "usr/bin applet", argv: []string{"usr/bin/env", "-i", "A=1"}, want: "A=1\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.Command(filepath.Join(mnt, tc.argv[0]), tc.argv[1:]...).CombinedOutput()
			if err != nil || string(out) != tc.want {
				t.Errorf("%q: %q, %v; want %q", tc.argv, out, err, tc.want)
			}
		})
	}
	for name, want := range map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
		"etc/group":  "root:x:0:\nuser:x:1000:\n",
	} {
		if b, err := os.ReadFile(filepath.Join(mnt, name)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v; want %q", name, b, err, want)
		}
	}
	entries := walk(t, mnt)
	for name, want := range map[string]entry{
		"etc/passwd": {mode: 0o644},
		"tmp":        {mode: fs.ModeDir | fs.ModeSticky | 0o777},
		"root":       {mode: fs.ModeDir | 0o700},
		"home/user":  {mode: fs.ModeDir | 0o755, uid: 1000, gid: 1000},
		"bin/sh":     {mode: fs.ModeSymlink | 0o777, link: "../bin/busybox"},
	} {
		if got := entries[name]; got != want {
			t.Errorf("mounted %s: %+v, want %+v", name, got, want)
		}
	}
	if err := os.WriteFile(filepath.Join(mnt, "tmp", "x"), nil, 0o644); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("writing into the mounted layer: %v, want a read-only error", err)
	}
}
