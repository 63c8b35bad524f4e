package httpapi

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	wire "github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// FuzzDecode feeds arbitrary bodies to the strict JSON decoder: it never
// panics, and every refusal is a classified client error.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{"tier":"function"}`, `{"tier":`, `[]`, `{} {}`, `{"cpu":"x"}`, `{"unknown":1}`, ``, `null`} {
		f.Add(s)
	}
	s := &Server{opt: Options{MaxBodyBytes: 4096}}
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(body))
		w := httptest.NewRecorder()
		var req wire.CreateSandboxRequest
		err := s.decode(w, r, &req)
		if err != nil && !errors.Is(err, errdefs.Invalid) && !errors.Is(err, errdefs.TooLarge) {
			t.Fatalf("decode(%q) = %v, want Invalid or TooLarge", body, err)
		}
	})
}

func TestStatusMapping(t *testing.T) {
	want := map[errdefs.Class]int{
		errdefs.Invalid: 400, errdefs.Unauthenticated: 401, errdefs.PermissionDenied: 403, errdefs.NotFound: 404,
		errdefs.Conflict: 409, errdefs.TooLarge: 413, errdefs.Unsupported: 422, errdefs.RateLimited: 429,
		errdefs.Unavailable: 503, errdefs.DeadlineExceeded: 504, errdefs.Internal: 500,
	}
	for _, c := range errdefs.Classes {
		if got := statusOf(c); got != want[c] {
			t.Errorf("statusOf(%s) = %d, want %d", c, got, want[c])
		}
	}
}
