package client

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestErrorDecoding(t *testing.T) {
	tests := []struct {
		name   string
		status int
		header map[string]string
		body   string
		want   *Error
	}{
		{
			name:   "json",
			status: http.StatusNotFound,
			body:   `{"code":"sandbox_not_found","message":"sandbox sb-1 not found","class":"not_found"}`,
			want:   &Error{StatusCode: 404, Code: "sandbox_not_found", Message: "sandbox sb-1 not found", Class: ClassNotFound},
		},
		{
			name:   "json without class",
			status: http.StatusConflict,
			body:   `{"code":"sandbox_stopped","message":"sandbox is stopped"}`,
			want:   &Error{StatusCode: 409, Code: "sandbox_stopped", Message: "sandbox is stopped", Class: ClassConflict},
		},
		{
			name:   "plain text",
			status: http.StatusBadGateway,
			body:   "upstream down\n",
			want:   &Error{StatusCode: 502, Message: "upstream down", Class: ClassUnavailable},
		},
		{
			name:   "empty body",
			status: http.StatusInternalServerError,
			want:   &Error{StatusCode: 500, Class: ClassInternal},
		},
		{
			name:   "json that is no error object",
			status: http.StatusBadRequest,
			body:   `[1,2]`,
			want:   &Error{StatusCode: 400, Message: "[1,2]", Class: ClassInvalid},
		},
		{
			name:   "rate limited with retry-after",
			status: http.StatusTooManyRequests,
			header: map[string]string{"Retry-After": "7"},
			body:   `{"code":"rate_limited","message":"slow down","class":"rate_limited"}`,
			want:   &Error{StatusCode: 429, Code: "rate_limited", Message: "slow down", Class: ClassRateLimited, RetryAfter: 7 * time.Second},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tt.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
			}, WithRetry(0))
			_, err := c.GetSandbox(context.Background(), "sb-1")
			var got *Error
			if !errors.As(err, &got) {
				t.Fatalf("GetSandbox error = %v, want *Error", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("error mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestErrorString(t *testing.T) {
	tests := []struct {
		name string
		err  *Error
		want string
	}{
		{"code", &Error{StatusCode: 404, Code: "sandbox_not_found", Message: "no such sandbox"}, "no such sandbox (sandbox_not_found)"},
		{"no code", &Error{StatusCode: 502, Message: "bad"}, "bad (HTTP 502)"},
		{"no message", &Error{StatusCode: 503}, "Service Unavailable (HTTP 503)"},
		{"stream", &Error{Message: "trap"}, "trap"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestErrorIs(t *testing.T) {
	tests := []struct {
		name  string
		class string
		is    func(error) bool
		want  error
	}{
		{"not found", ClassNotFound, IsNotFound, ErrNotFound},
		{"conflict", ClassConflict, IsConflict, ErrConflict},
		{"rate limited", ClassRateLimited, IsRateLimited, ErrRateLimited},
		{"unsupported", ClassUnsupported, IsUnsupported, ErrUnsupported},
		{"invalid", ClassInvalid, IsInvalid, ErrInvalid},
		{"unauthenticated", ClassUnauthenticated, IsUnauthenticated, ErrUnauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error = &Error{Class: tt.class}
			wrapped := errors.Join(errors.New("context"), err)
			if !tt.is(wrapped) || !errors.Is(wrapped, tt.want) {
				t.Errorf("%s error does not match its helper and sentinel", tt.class)
			}
			if errors.Is(err, ErrInternal) {
				t.Errorf("%s error matches ErrInternal", tt.class)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name string
		v    string
		want time.Duration
	}{
		{"empty", "", 0},
		{"seconds", "3", 3 * time.Second},
		{"zero", "0", 0},
		{"negative", "-4", 0},
		{"date", now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{"past date", now.Add(-time.Minute).Format(http.TimeFormat), 0},
		{"garbage", "soon", 0},
		{"huge", "99999999999999", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parseRetryAfter(tt.v, now); got != tt.want {
				t.Errorf("parseRetryAfter(%q) = %v, want %v", tt.v, got, tt.want)
			}
		})
	}
}
