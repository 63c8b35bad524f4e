package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/api"
)

// newMuxClient returns a client of a test server running mux, whose
// patterns are the server's (so that paths route as they would there).
func newMuxClient(t *testing.T, mux *http.ServeMux, opts ...Option) *Client {
	t.Helper()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, "secret", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestLayerRefPaths(t *testing.T) {
	var seen []string
	mux := http.NewServeMux()
	record := func(r *http.Request) {
		seen = append(seen, r.Method+" "+r.URL.EscapedPath()+" ref="+r.PathValue("ref"))
	}
	mux.HandleFunc("GET /v1/layers/{ref...}", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		writeJSON(w, http.StatusOK, api.Layer{ID: "sha256:aa", Names: []string{r.PathValue("ref")}})
	})
	mux.HandleFunc("DELETE /v1/layers/{ref...}", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/images/{ref...}", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		writeJSON(w, http.StatusOK, api.Image{ID: "sha256:bb", Name: r.PathValue("ref")})
	})
	mux.HandleFunc("DELETE /v1/images/{ref...}", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		w.WriteHeader(http.StatusNoContent)
	})
	c := newMuxClient(t, mux)
	ctx := context.Background()

	l, err := c.GetLayer(ctx, "toolkit/wasm-tools:0123abcd")
	if err != nil || l.Names[0] != "toolkit/wasm-tools:0123abcd" {
		t.Fatalf("GetLayer: %+v, %v", l, err)
	}
	if _, err := c.GetLayer(ctx, "my layers/a b:1+2"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteLayer(ctx, "sha256:0123"); err != nil {
		t.Fatal(err)
	}
	img, err := c.GetImage(ctx, "team/py:3.12")
	if err != nil || img.Name != "team/py:3.12" {
		t.Fatalf("GetImage: %+v, %v", img, err)
	}
	if err := c.DeleteImage(ctx, "q%?#x:1"); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"GET /v1/layers/toolkit/wasm-tools:0123abcd ref=toolkit/wasm-tools:0123abcd",
		"GET /v1/layers/my%20layers/a%20b:1+2 ref=my layers/a b:1+2",
		"DELETE /v1/layers/sha256:0123 ref=sha256:0123",
		"GET /v1/images/team/py:3.12 ref=team/py:3.12",
		"DELETE /v1/images/q%25%3F%23x:1 ref=q%?#x:1",
	}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("requests mismatch (-want +got):\n%s", diff)
	}
}

func TestBadRefs(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("unexpected request %s %s", r.Method, r.URL)
	})
	ctx := context.Background()
	for _, ref := range []string{"", "/abs", "a//b", "a/../b", "./a", "a/"} {
		if _, err := c.GetLayer(ctx, ref); err == nil {
			t.Errorf("GetLayer(%q) succeeded", ref)
		}
		if err := c.DeleteImage(ctx, ref); err == nil {
			t.Errorf("DeleteImage(%q) succeeded", ref)
		}
	}
	if _, err := c.ImportLayer(ctx, "zip", strings.NewReader(""), ""); err == nil {
		t.Error("ImportLayer of kind zip succeeded")
	}
	if _, err := c.BuildDirLayer(ctx, "", "x:1"); err == nil {
		t.Error("BuildDirLayer without a path succeeded")
	}
	if _, err := c.CreateImage(ctx, api.CreateImageRequest{Base: "b"}); err == nil {
		t.Error("CreateImage without a name succeeded")
	}
}

func TestListLayers(t *testing.T) {
	layers := api.LayerList{Layers: []api.Layer{{
		ID: "sha256:aa", Names: []string{"base/busybox:1.36"}, MetaSize: 4096, BlobSize: 1 << 20,
		SourceKind: "dir", Source: "sha256:cc", Builder: "dsec-erofs/1",
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/layers", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, layers)
	})
	got, err := newMuxClient(t, mux).ListLayers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&layers, got); diff != "" {
		t.Errorf("mismatch (-want +got):\n%s", diff)
	}
}

func TestImportLayer(t *testing.T) {
	type seen struct {
		Query         string
		ContentType   string
		ContentLength int64
		Chunked       bool
		Body          string
	}
	var got []seen
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/layers", func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
		}
		got = append(got, seen{r.URL.RawQuery, r.Header.Get("Content-Type"), r.ContentLength, len(r.TransferEncoding) > 0, string(b)})
		writeJSON(w, http.StatusCreated, api.Layer{ID: "sha256:dd", Names: []string{r.URL.Query().Get("name")}, SourceKind: r.URL.Query().Get("kind")})
	})
	c := newMuxClient(t, mux)
	ctx := context.Background()

	l, err := c.ImportLayer(ctx, KindTar, bytes.NewReader([]byte("tar bytes")), "work/space:v1")
	if err != nil || l.ID != "sha256:dd" || l.Names[0] != "work/space:v1" {
		t.Fatalf("ImportLayer: %+v, %v", l, err)
	}
	if _, err := c.ImportLayer(ctx, KindOCI, io.MultiReader(strings.NewReader("oci")), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ImportLayer(ctx, "", strings.NewReader(""), ""); err != nil {
		t.Fatal(err)
	}
	want := []seen{
		{"kind=tar&name=work%2Fspace%3Av1", "application/x-tar", 9, false, "tar bytes"},
		{"kind=oci", "application/x-tar", -1, true, "oci"},
		{"", "application/x-tar", 0, false, ""},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests mismatch (-want +got):\n%s", diff)
	}
}

// TestImportLayerStreams proves the body is sent as it is produced: the
// second part is only written once the server has read the first.
func TestImportLayerStreams(t *testing.T) {
	firstRead := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/layers", func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 5)
		if _, err := io.ReadFull(r.Body, buf); err != nil || string(buf) != "part1" {
			t.Errorf("first part %q, %v", buf, err)
		}
		close(firstRead)
		rest, _ := io.ReadAll(r.Body)
		writeJSON(w, http.StatusCreated, api.Layer{ID: "sha256:" + string(buf) + string(rest)})
	})
	c := newMuxClient(t, mux)
	pr, pw := io.Pipe()
	go func() {
		defer pw.Close()
		if _, err := pw.Write([]byte("part1")); err != nil {
			return
		}
		select {
		case <-firstRead:
			_, _ = pw.Write([]byte("part2"))
		case <-time.After(10 * time.Second):
			pw.CloseWithError(errors.New("the server never saw the first part: the body was buffered"))
		}
	}()
	l, err := c.ImportLayer(context.Background(), KindTar, pr, "")
	if err != nil || l.ID != "sha256:part1part2" {
		t.Fatalf("ImportLayer: %+v, %v", l, err)
	}
}

// TestImportLayerNoTimeoutNoRetry: a slow upload outlives the client's
// request timeout, and a 429 is not retried (the body is gone).
func TestImportLayerNoTimeoutNoRetry(t *testing.T) {
	var calls atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/layers", func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Query().Get("name") == "busy:1" {
			w.Header().Set("Retry-After", "0")
			writeJSON(w, http.StatusTooManyRequests, api.Error{Code: "rate_limited", Message: "slow down", Class: ClassRateLimited})
			return
		}
		time.Sleep(300 * time.Millisecond) // the build
		writeJSON(w, http.StatusCreated, api.Layer{ID: "sha256:ee"})
	})
	mux.HandleFunc("POST /v1/layers/dir", func(w http.ResponseWriter, r *http.Request) {
		var req api.BuildDirLayerRequest
		decodeStrict(t, r, &req)
		time.Sleep(300 * time.Millisecond)
		writeJSON(w, http.StatusCreated, api.Layer{ID: "sha256:ff", Names: []string{req.Name}, Source: req.Path})
	})
	c := newMuxClient(t, mux, WithTimeout(50*time.Millisecond), WithRetry(3))
	ctx := context.Background()
	if _, err := c.ImportLayer(ctx, KindTar, strings.NewReader("x"), ""); err != nil {
		t.Errorf("slow ImportLayer: %v", err)
	}
	calls.Store(0)
	_, err := c.ImportLayer(ctx, KindTar, strings.NewReader("x"), "busy:1")
	if !IsRateLimited(err) || calls.Load() != 1 {
		t.Errorf("ImportLayer on 429: %v after %d calls, want the error after 1", err, calls.Load())
	}
	l, err := c.BuildDirLayer(ctx, "/srv/ws", "ws:1")
	if err != nil || l.Source != "/srv/ws" || l.Names[0] != "ws:1" {
		t.Errorf("slow BuildDirLayer: %+v, %v", l, err)
	}
	// ctx still bounds them.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.ImportLayer(short, KindTar, strings.NewReader("x"), ""); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ImportLayer past its context's deadline: %v", err)
	}
}

func TestDeleteLayerInUse(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("DELETE /v1/layers/{ref...}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusConflict, api.Error{Code: "layer_in_use", Message: "layer is used by image py:1", Class: ClassConflict})
	})
	mux.HandleFunc("GET /v1/layers/{ref...}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, api.Error{Code: "layer_not_found", Message: "no layer " + r.PathValue("ref"), Class: ClassNotFound})
	})
	c := newMuxClient(t, mux)
	err := c.DeleteLayer(context.Background(), "base/x:1")
	var e *Error
	if !IsConflict(err) || !errors.As(err, &e) || e.Code != "layer_in_use" {
		t.Errorf("DeleteLayer in use: %v", err)
	}
	if _, err := c.GetLayer(context.Background(), "base/x:1"); !IsNotFound(err) || !strings.Contains(err.Error(), "no layer base/x:1") {
		t.Errorf("GetLayer unknown: %v", err)
	}
}

func TestImageCreateAndTag(t *testing.T) {
	var creates []api.CreateImageRequest
	var tags []api.TagRequest
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/images", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateImageRequest
		decodeStrict(t, r, &req)
		creates = append(creates, req)
		writeJSON(w, http.StatusCreated, api.Image{ID: "sha256:11", Name: req.Name, Layers: req.Layers, Source: "layers"})
	})
	mux.HandleFunc("POST /v1/images/tag", func(w http.ResponseWriter, r *http.Request) {
		var req api.TagRequest
		decodeStrict(t, r, &req)
		tags = append(tags, req)
		writeJSON(w, http.StatusOK, api.Image{ID: "sha256:11", Name: req.Name})
	})
	c := newMuxClient(t, mux)
	ctx := context.Background()
	short := api.CreateImageRequest{Name: "py:1", Base: "base/debian-12:2026.01.01", Workspace: "ws:1", Toolkit: "toolkit/dsec-guest:1", Tiers: []string{"container"}}
	if img, err := c.CreateImage(ctx, short); err != nil || img.Name != "py:1" {
		t.Fatalf("CreateImage: %+v, %v", img, err)
	}
	full := api.CreateImageRequest{Name: "fn:1", Layers: []api.ImageLayer{{Role: "base", ID: "sha256:aa"}, {Role: "data", ID: "d:1"}}}
	img, err := c.CreateImage(ctx, full)
	if err != nil || len(img.Layers) != 2 {
		t.Fatalf("CreateImage: %+v, %v", img, err)
	}
	if img, err := c.TagImage(ctx, "py:1", "py:latest"); err != nil || img.Name != "py:latest" {
		t.Fatalf("TagImage: %+v, %v", img, err)
	}
	if diff := cmp.Diff([]api.CreateImageRequest{short, full}, creates); diff != "" {
		t.Errorf("create requests mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]api.TagRequest{{Image: "py:1", Name: "py:latest"}}, tags); diff != "" {
		t.Errorf("tag requests mismatch (-want +got):\n%s", diff)
	}
}
