package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/cli"
)

// dsec runs the dsec CLI in-process against u and returns its exit code,
// stdout and stderr.
func (u *up) dsec(stdin string, args ...string) (int, string, string) {
	u.t.Helper()
	root := cli.NewRoot("test", Commands(Build{Version: "test"})...)
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(append([]string{"--url", u.info.APIURL, "--token", u.token()}, args...))
	code := cli.Execute(context.Background(), root)
	return code, out.String(), errb.String()
}

func TestCLIAgainstTheServer(t *testing.T) {
	u := startUp(t, "", nil)
	code, out, errs := u.dsec("", "sandbox", "create", "--tier", "function", "--label", "via=cli", "--json")
	var sb api.Sandbox
	if code != 0 || json.Unmarshal([]byte(out), &sb) != nil || sb.Labels["via"] != "cli" {
		t.Fatalf("sandbox create: %d %q %q", code, out, errs)
	}
	if code, out, _ := u.dsec("", "exec", sb.ID, "--", "echo", "hello", "cli"); code != 0 || out != "hello cli\n" {
		t.Errorf("exec: %d %q", code, out)
	}
	if code, _, _ := u.dsec("", "exec", sb.ID, "--", "exit", "7"); code != 7 {
		t.Errorf("exec exit 7: CLI exited %d", code)
	}
	if code, out, _ := u.dsec("from stdin\n", "exec", "--stdin", sb.ID, "--", "cat"); code != 0 || out != "from stdin\n" {
		t.Errorf("exec --stdin: %d %q", code, out)
	}
	local := filepath.Join(t.TempDir(), "in.txt")
	os.WriteFile(local, []byte("uploaded by the CLI"), 0o644)
	if code, _, errs := u.dsec("", "files", "put", sb.ID, local, "docs/in.txt"); code != 0 {
		t.Fatalf("files put: %d %q", code, errs)
	}
	if code, out, _ := u.dsec("", "files", "cat", sb.ID, "docs/in.txt"); code != 0 || out != "uploaded by the CLI" {
		t.Errorf("files cat: %d %q", code, out)
	}
	back := filepath.Join(t.TempDir(), "out.txt")
	if code, _, _ := u.dsec("", "files", "get", sb.ID, "docs/in.txt", back); code != 0 {
		t.Errorf("files get: %d", code)
	} else if b, _ := os.ReadFile(back); string(b) != "uploaded by the CLI" {
		t.Errorf("files get wrote %q", b)
	}
	if code, out, _ := u.dsec("", "files", "ls", sb.ID, "docs"); code != 0 || !strings.Contains(out, "in.txt") {
		t.Errorf("files ls: %d %q", code, out)
	}
	if code, out, _ := u.dsec("", "sandbox", "ls", "--label", "via=cli"); code != 0 || !strings.Contains(out, sb.ID) || !strings.Contains(out, "running") {
		t.Errorf("sandbox ls: %d %q", code, out)
	}
	if code, out, _ := u.dsec("", "run", "--tier", "function", "--", "calc", "6*7"); code != 0 || strings.TrimSpace(out) != "42" {
		t.Errorf("run: %d %q", code, out)
	}
	if code, _, errs := u.dsec("", "exec", "sb-missing", "--", "echo"); code != 1 || !strings.Contains(errs, "sandbox_not_found") {
		t.Errorf("exec in a missing sandbox: %d %q", code, errs)
	}
	if code, _, _ := u.dsec("", "sandbox", "rm", sb.ID); code != 0 {
		t.Errorf("sandbox rm: %d", code)
	}
	// run deleted its sandbox: only the removed one is left, stopped.
	all, err := u.c.ListAllSandboxes(context.Background(), client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if s.State != api.StateStopped {
			t.Errorf("sandbox %s left %s", s.ID, s.State)
		}
	}
	if code, out, _ := u.dsec("", "version"); code != 0 || !strings.Contains(out, "test") {
		t.Errorf("version: %d %q", code, out)
	}
	if code, out, _ := u.dsec("", "token", "--data-dir", u.dir); code != 0 || strings.TrimSpace(out) != u.token() {
		t.Errorf("token: %d %q", code, out)
	}
}
