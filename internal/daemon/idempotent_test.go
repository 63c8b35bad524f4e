package daemon

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/auth"
)

// TestIdempotentCreate: through the real API, creates with the same
// request_id (in the body, or the Idempotency-Key header) make one
// sandbox; the same key with another request is a 409.
func TestIdempotentCreate(t *testing.T) {
	u := startUp(t, "", nil)
	ctx := context.Background()
	first, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{RequestID: "task-9/attempt"})
	if err != nil {
		t.Fatal(err)
	}
	token, err := auth.Load(u.dir)
	if err != nil {
		t.Fatal(err)
	}
	post := func(body, key string) (int, api.Sandbox, api.Error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.info.APIURL+"/v1/sandboxes", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(api.IdempotencyKeyHeader, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var sb api.Sandbox
		var e api.Error
		if resp.StatusCode < 300 {
			_ = json.NewDecoder(resp.Body).Decode(&sb)
		} else {
			_ = json.NewDecoder(resp.Body).Decode(&e)
		}
		return resp.StatusCode, sb, e
	}
	if code, sb, e := post(`{}`, "task-9/attempt"); code != http.StatusCreated || sb.ID != first.ID {
		t.Errorf("the same create by header: %d %+v %+v, want %s", code, sb, e, first.ID)
	}
	if code, _, e := post(`{"memory_mb": 512}`, "task-9/attempt"); code != http.StatusConflict || e.Code != api.CodeRequestIDReused {
		t.Errorf("the key with another request: %d %+v, want 409 request_id_reused", code, e)
	}
	l, err := u.c.ListSandboxes(ctx, client.ListOptions{})
	if err != nil || len(l.Sandboxes) != 1 {
		t.Errorf("sandboxes after three creates with one key: %d, %v; want 1", len(l.Sandboxes), err)
	}
}
