package function

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
)

// evilImage is the default image plus symlinks that point out of it.
func evilImage(t *testing.T) sandbox.Image {
	t.Helper()
	root := t.TempDir()
	bin := filepath.Join(root, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(testImage(t).Root, "bin")
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(bin, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"bin/evil":            "/etc",
		"etc-link":            "../../../../etc/passwd",
		"bin/outside.wasm":    "/usr/bin/env",
		"inside-link":         "bin",
		"bin/escape-dir/deep": "x", // a dangling one, harmless
	} {
		p := filepath.Join(root, link)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	return sandbox.Image{ID: "img-evil", Name: "evil", Root: root}
}

func TestGuestCannotLeave(t *testing.T) {
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Skipf("no /etc/passwd to try to read: %v", err)
	}
	rt := newRuntime(t, t.TempDir(), Options{})
	img := evilImage(t)
	sb := create(t, rt, func(s *sandbox.Spec) { s.Image = img })
	openat := installTool(t, sb, "openat")
	symlink := installTool(t, sb, "symlink")
	if _, err := sb.Files().Write(context.Background(), "/workspace/hello.txt", strings.NewReader("inside"), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The probes work on legitimate paths, so their failures below mean
	// something: fd 3 is /, fd 4 is /workspace.
	if res := run(t, sb, "", openat, "4", "hello.txt"); res.ExitCode != 0 || res.Stdout != "inside" {
		t.Fatalf("openat 4 hello.txt: %+v", res)
	}
	if res := run(t, sb, "", openat, "3", "bin/tiny-echo.wasm"); res.ExitCode != 0 {
		t.Fatalf("openat 3 bin/tiny-echo.wasm: %+v", res)
	}
	// (ls fails on the escaping links it lists, but lists the rest.)
	if res := run(t, sb, "", "ls", "/inside-link"); !strings.Contains(res.Stdout, "cat.wasm") {
		t.Errorf("a symlink inside the image should work: %+v", res)
	}

	escapes := [][]string{
		{"cat", "/bin/evil/passwd"},
		{"cat", "/etc-link"},
		{"cat", "/etc/passwd"},
		{"cat", "/workspace/../../etc/passwd"},
		{"ls", "/bin/evil"},
		{openat, "3", "../../etc/passwd"},
		{openat, "4", "../../etc/passwd"},
		{openat, "4", "../bin/cat.wasm"},
		{openat, "3", "bin/evil/passwd"},
		{openat, "3", "etc-link"},
		{openat, "3", "/etc/passwd"},
	}
	for _, argv := range escapes {
		res := run(t, sb, "", argv...)
		t.Logf("%q: exit %d: %s", argv, res.ExitCode, strings.TrimSpace(res.Stderr))
		if res.ExitCode == 0 || strings.Contains(res.Stdout, "root:") {
			t.Errorf("%q escaped: %+v", argv, res)
		}
	}

	// Guests cannot plant symlinks in the workspace.
	for _, target := range []string{"../../../etc", "/etc", "hello.txt"} {
		if res := run(t, sb, "", symlink, target, "/workspace/link"); res.ExitCode == 0 {
			t.Errorf("guest created a symlink to %s: %+v", target, res)
		}
	}
	if _, err := os.Lstat(filepath.Join(sb.workDir, "link")); !os.IsNotExist(err) {
		t.Errorf("a symlink appeared in the workspace: %v", err)
	}

	// Modules are resolved inside the image too.
	_, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"outside"}}})
	if err == nil {
		t.Errorf("ran a module through a symlink out of the image")
	}
	// The image is read-only.
	if res := run(t, sb, "x", "write", "/bin/new.wasm"); res.ExitCode == 0 {
		t.Errorf("guest wrote into the image: %+v", res)
	}
	if _, err := os.Stat(filepath.Join(img.Root, "bin", "new.wasm")); !os.IsNotExist(err) {
		t.Errorf("image changed: %v", err)
	}
}

func TestWorkspaceFSRefusesSymlinks(t *testing.T) {
	fs := newWorkspaceFS(t.TempDir())
	if errno := fs.Symlink("../../etc", "x"); errno != experimentalsys.EPERM {
		t.Errorf("Symlink = %v, want EPERM", errno)
	}
}

func TestFilesConfinedByRoot(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, nil)
	// Even if a symlink appeared in the workspace (the files API and
	// guests cannot make one), the files API would not follow it out.
	if err := os.Symlink("/etc", filepath.Join(sb.workDir, "etc")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := sb.Files().Open(context.Background(), "/workspace/etc/passwd"); err == nil {
		t.Errorf("Open through a symlink out of the workspace succeeded")
	}
	if _, err := sb.Files().Write(context.Background(), "/workspace/etc/x", strings.NewReader("x"), sandbox.WriteOptions{}); err == nil {
		t.Errorf("Write through a symlink out of the workspace succeeded")
	}
	fi, err := sb.Files().Stat(context.Background(), "/workspace/etc")
	if err != nil || fi.Type != api.FileTypeSymlink || fi.Target != "/etc" {
		t.Errorf("Stat(symlink) = %+v, %v", fi, err)
	}
}
