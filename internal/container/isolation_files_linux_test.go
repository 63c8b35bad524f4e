package container

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// naiveRead is what a file API that resolved paths on the host would do:
// join the sandbox's root and the path, and read what that leads to.
func naiveRead(rootfs, p string) string {
	b, _ := os.ReadFile(filepath.Join(rootfs, p))
	return string(b)
}

// readVia reads p through the sandbox's file API; ok is false if it
// refused.
func readVia(ctx context.Context, sb *Sandbox, p string) (string, bool) {
	rc, _, err := sb.Files().Open(ctx, p)
	if err != nil {
		return "", false
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return string(b), err == nil
}

// testFileAPI covers §3.4: the host-facing file API and output.
func testFileAPI(t *testing.T, e *isoEnv, main *Sandbox) {
	ctx := context.Background()
	// The host reaches the sandbox's root (in no host mount table)
	// through its first process's root link; a naive resolver there
	// follows absolute links from the host's root.
	rootfs := fmt.Sprintf("/proc/%d/root", main.state.Pid)
	// The sandbox plants links to the host's root and its secret.
	planted := run(t, main, sh(`mkdir -p /tmp/o && cd /tmp/o && ln -sfn / root && ln -sfn /`+e.secretRel+` sec &&
		ln -sfn `+strings.Repeat("../", 32)+e.secretRel+` relsec && ln -sfn `+strings.Repeat("../", 32)+` up && ln -sfn /etc/shadow shadow`)...)
	if planted.ExitCode != 0 {
		t.Fatalf("planting links: %+v", planted)
	}
	unchanged := func(t *testing.T) {
		t.Helper()
		if b, _ := os.ReadFile(e.secretPath); string(b) != e.secret+"\n" {
			t.Errorf("the host's secret file now holds %q", b)
		}
	}

	t.Run("A39_upload_paths", func(t *testing.T) {
		hostPasswd, _ := os.ReadFile("/etc/passwd")
		f := main.Files()
		refused := []string{
			"../../../../etc/cron.d/x", "a/../../b", "/tmp/../../../etc/x", "../" + e.secretRel,
			"/tmp/a\x00b", "/tmp/" + strings.Repeat("a", 4096), "/tmp/" + strings.Repeat("b", 300),
		}
		for _, p := range refused {
			if _, err := f.Write(ctx, p, strings.NewReader("pwned"), sandbox.WriteOptions{Parents: true}); err == nil {
				t.Errorf("write %.60q was accepted", p)
			}
		}
		if _, err := f.Mkdir(ctx, "../../x", true); err == nil {
			t.Error("mkdir ../../x was accepted")
		}
		if _, err := f.Rename(ctx, "/tmp/o/shadow", "../../../x"); err == nil {
			t.Error("rename to ../../../x was accepted")
		}
		if err := f.Remove(ctx, "../../tmp", true); err == nil {
			t.Error("remove ../../tmp was accepted")
		}
		e.auditedWhere(t, main, "path-escape-refused", "denied", "upload of ../../../../etc/cron.d/x", func(ev api.AuditEvent) bool {
			return ev.Kind == "file-api" && ev.Path == "../../../../etc/cron.d/x"
		})
		// Through the planted links: refused, or written inside.
		for _, p := range []string{"/tmp/o/root/" + e.secretRel, "/tmp/o/up/" + e.secretRel, "/tmp/o/sec", "/tmp/o/relsec"} {
			_, _ = f.Write(ctx, p, strings.NewReader("pwned"), sandbox.WriteOptions{Parents: true})
		}
		unchanged(t)
		// The sandbox's own /etc/passwd is the sandbox's to change.
		if _, err := f.Write(ctx, "/etc/passwd", strings.NewReader("pwned\n"), sandbox.WriteOptions{}); err != nil {
			t.Errorf("writing the sandbox's /etc/passwd: %v", err)
		}
		if got := run(t, main, "cat", "/etc/passwd").Stdout; got != "pwned\n" {
			t.Errorf("the sandbox's /etc/passwd: %q", got)
		}
		if b, _ := os.ReadFile("/etc/passwd"); string(b) != string(hostPasswd) {
			t.Error("the host's /etc/passwd changed")
		}
		// Negative control: resolved on the host, the same paths leave the
		// sandbox's root.
		for _, p := range []string{"../../../../etc/cron.d/x", "../" + e.secretRel} {
			if j := filepath.Join(rootfs, p); within(j, rootfs) {
				t.Errorf("negative control: %s joined to the root stays inside: %s", p, j)
			}
		}
		// (EvalSymlinks would also resolve /proc/<pid>/root, itself a
		// link, to "/": the link's own target is the control.)
		if target, err := os.Readlink(filepath.Join(rootfs, "tmp/o/root")); err != nil || target != "/" {
			t.Errorf("negative control: the planted link leads on the host to %q (%v)", target, err)
		}
	})

	t.Run("A40_download_symlinks", func(t *testing.T) {
		paths := []string{"/tmp/o/sec", "/tmp/o/relsec", "/tmp/o/root/" + e.secretRel, "/tmp/o/up/" + e.secretRel, "/tmp/o/shadow"}
		var refused []string
		for _, p := range paths {
			got, ok := readVia(ctx, main, p)
			if ok && strings.Contains(got, e.secret) {
				t.Errorf("open %s returned the host's secret", p)
			}
			if !ok {
				refused = append(refused, p)
			}
		}
		// The refusals are on the record, each with the path asked for.
		// (A link whose target A39 wrote inside the sandbox now leads to
		// that file: read, not refused.)
		if len(refused) < 3 {
			t.Errorf("only %v of the links were refused", refused)
		}
		for _, p := range refused {
			e.auditedWhere(t, main, "path-escape-refused", "denied", "open "+p, func(ev api.AuditEvent) bool {
				return ev.Kind == "file-api" && ev.Syscall == "open" && ev.Path == p
			})
		}
		ls, _ := main.Files().List(ctx, "/tmp/o/root/"+filepath.Dir(e.secretRel), 1)
		for _, fi := range ls {
			if fi.Name == filepath.Base(e.secretPath) {
				t.Errorf("list through the link shows the host's %s", fi.Name)
			}
		}
		// Negative control: a host-side download follows them out.
		leaked := 0
		for _, p := range paths {
			if strings.Contains(naiveRead(rootfs, p), e.secret) {
				leaked++
			}
		}
		if leaked == 0 {
			t.Error("negative control: no planted link leads to the host's secret when resolved on the host")
		}
	})

	t.Run("A41_symlink_race", func(t *testing.T) {
		// The sandbox flips a directory link between the host's root and
		// a directory of its own holding a decoy at the secret's path.
		flip, err := main.StartProcess(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(`
			mkdir -p /tmp/r/real/` + filepath.Dir(e.secretRel) + ` && echo decoy > /tmp/r/real/` + e.secretRel + ` && cd /tmp/r &&
			while :; do ln -sfn / d; ln -sfn real d; ln -sfn ` + strings.Repeat("../", 32) + ` d; done`)}})
		if err != nil {
			t.Fatal(err)
		}
		defer flip.Signal("KILL")
		time.Sleep(50 * time.Millisecond)
		p := "/tmp/r/d/" + e.secretRel
		// At least 300 reads over at least a second, so that the link
		// flips many times under them.
		reads, decoys := 0, 0
		for start := time.Now(); reads < 300 || time.Since(start) < time.Second; reads++ {
			got, ok := readVia(ctx, main, p)
			if strings.Contains(got, e.secret) {
				t.Fatalf("read %d: the host's secret", reads)
			}
			if ok && got == "decoy\n" {
				decoys++
			}
		}
		t.Logf("%d reads during the race: %d saw the sandbox's decoy, none the host", reads, decoys)
		if decoys < reads {
			e.auditedWhere(t, main, "path-escape-refused", "denied", "a read during the race", func(ev api.AuditEvent) bool {
				return ev.Kind == "file-api" && ev.Path == p
			})
		}
		// Negative control: host-side reads during the same race reach
		// the secret (within seconds: the flipping shell may be slow to
		// get a CPU).
		leaked := false
		for deadline := time.Now().Add(10 * time.Second); !leaked && time.Now().Before(deadline); {
			leaked = strings.Contains(naiveRead(rootfs, p), e.secret)
		}
		if !leaked {
			t.Error("negative control: host-side reads during the race never reached the host's secret")
		}
		unchanged(t)
	})

	t.Run("A43_output_flood", func(t *testing.T) {
		const capBytes = 1 << 20
		floods := []struct {
			name string
			req  api.ExecRequest
		}{
			{"stdout", api.ExecRequest{Cmd: sh("head -c 16m /dev/zero"), MaxOutputBytes: capBytes}},
			{"stderr", api.ExecRequest{Cmd: sh("head -c 16m /dev/zero >&2"), MaxOutputBytes: capBytes}},
			{"endless", api.ExecRequest{Cmd: []string{"yes"}, MaxOutputBytes: capBytes, TimeoutS: 1}},
			{"urandom", api.ExecRequest{Cmd: []string{"cat", "/dev/urandom"}, MaxOutputBytes: capBytes, TimeoutS: 1}},
		}
		for _, f := range floods {
			start := time.Now()
			res := runReq(t, main, f.req)
			out, trunc := res.Stdout, res.StdoutTruncated
			if f.name == "stderr" {
				out, trunc = res.Stderr, res.StderrTruncated
			}
			if len(out) != capBytes || !trunc {
				t.Errorf("%s flood: %d bytes, truncated %v (cap %d)", f.name, len(out), trunc, capBytes)
			}
			if took := time.Since(start); took > 20*time.Second {
				t.Errorf("%s flood took %s", f.name, took)
			}
		}
		// The default cap holds too (4 MiB; seq prints ~4.7 MB).
		if res := run(t, main, "seq", "700000"); !res.StdoutTruncated || len(res.Stdout) > 4<<20 {
			t.Errorf("a million lines: %d bytes, truncated %v", len(res.Stdout), res.StdoutTruncated)
		}
		e.auditedWhere(t, main, "output-flood", "denied", "the endless flood", func(ev api.AuditEvent) bool { return ev.Path == "yes" })
		// Negative control: with the cap above the output, all of it.
		res := runReq(t, main, api.ExecRequest{Cmd: sh("head -c 8m /dev/zero"), MaxOutputBytes: 16 << 20})
		if len(res.Stdout) != 8<<20 || res.StdoutTruncated {
			t.Errorf("negative control: 8 MiB under a 16 MiB cap: %d bytes, truncated %v", len(res.Stdout), res.StdoutTruncated)
		}
	})
}
