package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/config"
)

func sha256hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func TestEndToEndFunctionTier(t *testing.T) {
	u := startUp(t, "", nil)
	ctx := context.Background()
	c := u.c

	nodes, err := c.Nodes(ctx)
	if err != nil || len(nodes.Nodes) != 1 || nodes.Nodes[0].ID != "test-node" {
		t.Fatalf("Nodes = %+v, %v", nodes, err)
	}
	var fn *api.TierInfo
	for i, ti := range nodes.Nodes[0].Tiers {
		if ti.Name == api.TierFunction {
			fn = &nodes.Nodes[0].Tiers[i]
		}
	}
	if fn == nil || !fn.Available || nodes.Nodes[0].Capacity.CPUs == 0 {
		t.Errorf("node info lacks an available function tier or capacity: %+v", nodes.Nodes[0])
	}
	if v, err := c.Version(ctx); err != nil || v.API != "v1" || v.Version != "test" {
		t.Errorf("Version = %+v, %v", v, err)
	}
	if doc, err := c.OpenAPI(ctx); err != nil || !bytes.Contains(doc, []byte(`"openapi"`)) {
		t.Errorf("OpenAPI: %v", err)
	}

	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: "function", Labels: map[string]string{"run": "e2e"}, Env: map[string]string{"GREETING": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != api.StateRunning || sb.Image != "wasm-tools:latest" || sb.TimeoutS != 300 || sb.Node != "test-node" {
		t.Errorf("created %+v", sb)
	}
	res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "hello", "world"}})
	if err != nil || res.ExitCode != 0 || res.Stdout != "hello world\n" {
		t.Fatalf("exec echo = %+v, %v", res, err)
	}
	res, err = c.Exec(ctx, sb.ID, api.ExecRequest{Command: "calc '2 + 3 * 4'"})
	if err != nil || strings.TrimSpace(res.Stdout) != "14" {
		t.Errorf("exec calc = %+v, %v", res, err)
	}
	res, err = c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"env"}})
	if err != nil || !strings.Contains(res.Stdout, "GREETING=hi\n") {
		t.Errorf("sandbox env not passed: %+v, %v", res, err)
	}
	res, err = c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"exit", "3"}})
	if err != nil || res.ExitCode != 3 {
		t.Errorf("exit 3 = %+v, %v", res, err)
	}

	// Streaming, over NDJSON and WebSocket.
	for name, stream := range map[string]func(context.Context, string, api.ExecRequest, func(api.ExecEvent) error) (*api.ExecResult, error){
		"ndjson": c.ExecStream, "websocket": c.ExecWS,
	} {
		var kinds []string
		var out strings.Builder
		res, err := stream(ctx, sb.ID, api.ExecRequest{Cmd: []string{"cat"}, Stdin: "streamed\n"}, func(ev api.ExecEvent) error {
			kinds = append(kinds, ev.Type)
			if ev.Type == api.EventStdout {
				out.WriteString(ev.Data)
			}
			return nil
		})
		if err != nil || res.ExitCode != 0 || out.String() != "streamed\n" || kinds[0] != api.EventStart || kinds[len(kinds)-1] != api.EventExit {
			t.Errorf("%s stream: res=%+v err=%v out=%q kinds=%v", name, res, err, out.String(), kinds)
		}
	}

	// Files.
	big := bytes.Repeat([]byte("0123456789abcdef"), 2<<20) // 32 MiB
	fi, err := c.WriteFile(ctx, sb.ID, "data/big.bin", bytes.NewReader(big), client.WriteOptions{Parents: true})
	if err != nil || fi.Size != int64(len(big)) || fi.Path != "/workspace/data/big.bin" {
		t.Fatalf("WriteFile = %+v, %v", fi, err)
	}
	got, err := c.ReadFileBytes(ctx, sb.ID, "/workspace/data/big.bin")
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("ReadFile: %d bytes, %v", len(got), err)
	}
	res, err = c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sha256sum", "/workspace/data/big.bin"}})
	if err != nil || res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, sha256hex(big)) {
		t.Errorf("sha256sum in the sandbox = %+v, %v", res, err)
	}
	if _, err := c.Mkdir(ctx, sb.ID, "a/b", true); err != nil {
		t.Error(err)
	}
	if _, err := c.Rename(ctx, sb.ID, "data/big.bin", "a/b/moved.bin"); err != nil {
		t.Error(err)
	}
	list, err := c.ListFiles(ctx, sb.ID, "/workspace", 3)
	if err != nil || len(list.Entries) != 4 {
		t.Errorf("ListFiles depth 3 = %+v, %v", list, err)
	}
	if ok, err := c.Exists(ctx, sb.ID, "a/b/moved.bin"); !ok || err != nil {
		t.Errorf("Exists(moved) = %v, %v", ok, err)
	}
	if ok, err := c.Exists(ctx, sb.ID, "data/big.bin"); ok || err != nil {
		t.Errorf("Exists(old name) = %v, %v", ok, err)
	}
	if err := c.RemoveFile(ctx, sb.ID, "a", true); err != nil {
		t.Error(err)
	}

	// The function tier has no background processes: 422 naming the tier.
	_, err = c.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"cat"}})
	if !client.IsUnsupported(err) || !strings.Contains(err.Error(), "function") {
		t.Errorf("StartProcess on function: %v", err)
	}

	// Timeout, list and delete.
	if s, err := c.SetTimeout(ctx, sb.ID, 600*time.Second); err != nil || s.TimeoutS != 600 || time.Until(s.ExpiresAt) < 590*time.Second {
		t.Errorf("SetTimeout = %+v, %v", s, err)
	}
	other, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Labels: map[string]string{"run": "other"}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.ListSandboxes(ctx, client.ListOptions{Labels: map[string]string{"run": "e2e"}})
	if err != nil || len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != sb.ID {
		t.Errorf("list by label = %+v, %v", l, err)
	}
	page1, err := c.ListSandboxes(ctx, client.ListOptions{Limit: 1})
	if err != nil || len(page1.Sandboxes) != 1 || page1.Sandboxes[0].ID != other.ID || page1.NextPageToken == "" {
		t.Fatalf("page 1 = %+v, %v", page1, err)
	}
	page2, err := c.ListSandboxes(ctx, client.ListOptions{Limit: 1, PageToken: page1.NextPageToken})
	if err != nil || len(page2.Sandboxes) != 1 || page2.Sandboxes[0].ID != sb.ID || page2.NextPageToken != "" {
		t.Errorf("page 2 = %+v, %v", page2, err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Errorf("second delete: %v", err)
	}
	gone, err := c.GetSandbox(ctx, sb.ID)
	if err != nil || gone.State != api.StateStopped || gone.Reason != "deleted" || gone.EndedAt == nil {
		t.Errorf("after delete: %+v, %v", gone, err)
	}
	if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo"}}); !client.IsConflict(err) {
		t.Errorf("exec in a stopped sandbox: %v, want 409", err)
	}
	if _, err := os.Stat(u.workspaceDir(sb.ID)); !os.IsNotExist(err) {
		t.Errorf("workspace of a deleted sandbox still exists: %v", err)
	}

	// Metrics.
	m, err := c.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`dsec_sandboxes{state="running",tier="function"} 1`, `dsec_sandboxes{state="stopped",tier="function"} 1`,
		"dsec_sandbox_create_seconds_bucket", "dsec_exec_seconds_count", `dsec_api_errors_total{code="unsupported_on_tier"} 1`} {
		if !bytes.Contains(m, []byte(want)) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestTTLExpiry(t *testing.T) {
	u := startUp(t, "", nil)
	ctx := context.Background()
	sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{TimeoutS: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.c.WriteFile(ctx, sb.ID, "f", strings.NewReader("x"), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, err := u.c.GetSandbox(ctx, sb.ID)
		if err == nil && got.State == api.StateStopped {
			if got.Reason != "expired" {
				t.Errorf("reason = %q, want expired", got.Reason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox did not expire: %+v, %v", got, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := os.Stat(u.workspaceDir(sb.ID)); !os.IsNotExist(err) {
		t.Errorf("expired sandbox's workspace remains: %v", err)
	}
}

func TestRawHTTPErrors(t *testing.T) {
	u := startUp(t, "", func(c *config.Config) { c.API.MaxBodyBytes = 64 << 10 })
	tok := u.token()
	do := func(method, path, body string, auth bool) (int, api.Error, http.Header) {
		req, _ := http.NewRequest(method, u.info.APIURL+path, strings.NewReader(body))
		if auth {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e api.Error
		b, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(b, &e)
		return resp.StatusCode, e, resp.Header
	}
	sb, err := u.c.CreateSandbox(context.Background(), api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, method, path, body string
		auth                     bool
		status                   int
		code                     string
	}{
		{"no token", "GET", "/v1/sandboxes", "", false, 401, "unauthenticated"},
		{"malformed json", "POST", "/v1/sandboxes", `{"tier":`, true, 400, "invalid_json"},
		{"not an object", "POST", "/v1/sandboxes", `[1,2]`, true, 400, "invalid_field"},
		{"unknown field", "POST", "/v1/sandboxes", `{"tier":"function","colour":"red"}`, true, 400, "unknown_field"},
		{"trailing data", "POST", "/v1/sandboxes", `{} {}`, true, 400, "invalid_json"},
		{"empty body", "POST", "/v1/sandboxes", ``, true, 400, "empty_body"},
		{"wrong type", "POST", "/v1/sandboxes", `{"memory_mb":"lots"}`, true, 400, "invalid_field"},
		{"unknown tier", "POST", "/v1/sandboxes", `{"tier":"quantum"}`, true, 400, "unknown_tier"},
		{"unknown image", "POST", "/v1/sandboxes", `{"image":"no-such-image:1"}`, true, 404, "image_not_found"},
		{"bad image name", "POST", "/v1/sandboxes", `{"image":"../etc"}`, true, 400, "invalid_name"},
		{"negative memory", "POST", "/v1/sandboxes", `{"memory_mb":-1}`, true, 400, "out_of_range"},
		{"oversize body", "POST", "/v1/sandboxes", `{"labels":{"a":"` + strings.Repeat("x", 100<<10) + `"}}`, true, 413, "body_too_large"},
		{"unknown sandbox", "GET", "/v1/sandboxes/sb-nope", "", true, 404, "sandbox_not_found"},
		{"unknown route", "GET", "/v1/nothing", "", true, 404, "route_not_found"},
		{"bad query encoding", "GET", "/v1/sandboxes?limit=%zz", "", true, 400, "invalid_query"},
		{"bad state filter", "GET", "/v1/sandboxes?state=dancing", "", true, 400, "invalid_state"},
		{"bad page token", "GET", "/v1/sandboxes?page_token=!!!", "", true, 400, "invalid_page_token"},
		{"traversal", "GET", "/v1/sandboxes/" + sb.ID + "/files?path=../../etc/passwd", "", true, 400, "path_outside_root"},
		{"absolute escape", "PUT", "/v1/sandboxes/" + sb.ID + "/files?path=/etc/dsec-test", "x", true, 400, "path_outside_root"},
		{"missing path", "GET", "/v1/sandboxes/" + sb.ID + "/files", "", true, 400, "invalid_path"},
		{"bad mode", "PUT", "/v1/sandboxes/" + sb.ID + "/files?path=x&mode=999", "x", true, 400, "invalid_mode"},
		{"exec no command", "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{}`, true, 400, "invalid_command"},
		{"exec shell syntax", "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"command":"echo a | wc"}`, true, 422, "no_shell"},
		{"exec missing tool", "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":["no-such-tool"]}`, true, 404, "tool_not_found"},
		{"processes unsupported", "GET", "/v1/sandboxes/" + sb.ID + "/processes", "", true, 422, "unsupported_on_tier"},
		{"bad timeout", "POST", "/v1/sandboxes/" + sb.ID + "/timeout", `{"timeout_s":0}`, true, 400, "out_of_range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, e, _ := do(tt.method, tt.path, tt.body, tt.auth)
			if status != tt.status || e.Code != tt.code || e.Message == "" {
				t.Errorf("%s %s: status %d code %q (%q); want %d %q", tt.method, tt.path, status, e.Code, e.Message, tt.status, tt.code)
			}
		})
	}
	if _, err := os.Stat("/etc/dsec-test"); !os.IsNotExist(err) {
		t.Errorf("an absolute-path write escaped the workspace: %v", err)
	}
}

func (u *up) token() string {
	b, err := os.ReadFile(filepath.Join(u.dir, "token"))
	if err != nil {
		u.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
