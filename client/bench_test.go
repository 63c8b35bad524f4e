package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/dsec-dev/dsec/api"
)

func BenchmarkExec(b *testing.B) {
	body := []byte(`{"exit_code":0,"stdout":"hello\n","stderr":"","duration_ms":0.4}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	c, err := New(srv.URL, "secret")
	if err != nil {
		b.Fatal(err)
	}
	req := api.ExecRequest{Cmd: []string{"echo", "hello"}}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Exec(ctx, "sb-1", req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkExecStream(b *testing.B) {
	body := []byte(`{"type":"start","pid":1}
{"type":"stdout","data":"hello\n"}
{"type":"exit","result":{"exit_code":0,"stdout":"","stderr":"","duration_ms":0.4}}
`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	c, err := New(srv.URL, "secret")
	if err != nil {
		b.Fatal(err)
	}
	req := api.ExecRequest{Cmd: []string{"echo", "hello"}}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.ExecStream(ctx, "sb-1", req, nil); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
