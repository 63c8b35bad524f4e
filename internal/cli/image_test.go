package cli

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/api"
)

// imageServer answers the image endpoints with fixtures and records what
// it was asked.
type imageServer struct {
	creates []api.CreateImageRequest
	tags    []api.TagRequest
	added   []api.AddDirImageRequest
	seen    []string
}

func (s *imageServer) handler(t *testing.T) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/images", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.ImageList{Images: []api.Image{
			{ID: "sha256:0123456789abcdef0123", Name: "team/py:3.12", Tiers: []string{"container", "microvm"}, Source: "layers",
				Layers:    []api.ImageLayer{{Role: "base", ID: "sha256:aa"}, {Role: "workspace", ID: "sha256:bb"}, {Role: "toolkit", ID: "sha256:cc"}},
				CreatedAt: testNow.Add(-2 * time.Hour)},
			{ID: "img-2", Source: "dir:/srv/root", CreatedAt: testNow.Add(-72 * time.Hour)},
		}})
	})
	mux.HandleFunc("POST /v1/images", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateImageRequest
		decode(t, r, &req)
		s.creates = append(s.creates, req)
		writeJSON(w, http.StatusCreated, api.Image{ID: "sha256:feed", Name: req.Name, Layers: req.Layers, Source: "layers"})
	})
	mux.HandleFunc("POST /v1/images/tag", func(w http.ResponseWriter, r *http.Request) {
		var req api.TagRequest
		decode(t, r, &req)
		s.tags = append(s.tags, req)
		writeJSON(w, http.StatusOK, api.Image{ID: "sha256:feed", Name: req.Name})
	})
	mux.HandleFunc("POST /v1/images/dir", func(w http.ResponseWriter, r *http.Request) {
		var req api.AddDirImageRequest
		decode(t, r, &req)
		s.added = append(s.added, req)
		writeJSON(w, http.StatusCreated, api.Image{ID: "sha256:d1", Name: req.Name})
	})
	mux.HandleFunc("GET /v1/images/{ref...}", func(w http.ResponseWriter, r *http.Request) {
		s.seen = append(s.seen, "GET "+r.PathValue("ref"))
		if r.PathValue("ref") == "missing:1" {
			writeError(w, http.StatusNotFound, "image_not_found", "not_found", "no image missing:1")
			return
		}
		writeJSON(w, http.StatusOK, api.Image{ID: "sha256:feed", Name: r.PathValue("ref"), Source: "layers"})
	})
	mux.HandleFunc("DELETE /v1/images/{ref...}", func(w http.ResponseWriter, r *http.Request) {
		s.seen = append(s.seen, "DELETE "+r.PathValue("ref"))
		if strings.HasPrefix(r.PathValue("ref"), "sha256:") {
			writeError(w, http.StatusConflict, "image_in_use", "conflict", "image is used by a live sandbox")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

func TestImageList(t *testing.T) {
	var s imageServer
	h := s.handler(t)
	res := dsec(t, h, "image", "ls")
	want := `NAME          ID            LAYERS                  TIERS              SOURCE         AGE
team/py:3.12  0123456789ab  base,workspace,toolkit  container,microvm  layers         2h
-             img-2         -                       any                dir:/srv/root  3d
`
	if diff := cmp.Diff(want, res.stdout); diff != "" || res.code != 0 {
		t.Errorf("table (exit %d) mismatch (-want +got):\n%s", res.code, diff)
	}
	res = dsec(t, h, "--json", "image", "ls")
	var l api.ImageList
	if err := json.Unmarshal([]byte(res.stdout), &l); err != nil || len(l.Images) != 2 || len(l.Images[0].Layers) != 3 {
		t.Errorf("--json: %+v (%v)", res, err)
	}
}

func TestImageCreate(t *testing.T) {
	var s imageServer
	h := s.handler(t)
	res := dsec(t, h, "image", "create", "team/py:3.12", "--base", "base/debian-12:2026.01.01", "--workspace", "ws:1",
		"--toolkit", "toolkit/dsec-guest:1", "--tier", "container", "--tier", "vm")
	if res.code != 0 || res.stdout != "sha256:feed\n" {
		t.Errorf("create: %+v", res)
	}
	res = dsec(t, h, "--json", "image", "create", "fn:1", "--base", "base/busybox:1", "--layer", "data=sha256:dd", "--layer", "extra=x/y:2")
	var img api.Image
	if err := json.Unmarshal([]byte(res.stdout), &img); err != nil || res.code != 0 || img.Name != "fn:1" {
		t.Errorf("create --json: %+v (%v)", res, err)
	}
	want := []api.CreateImageRequest{
		{Name: "team/py:3.12", Base: "base/debian-12:2026.01.01", Workspace: "ws:1", Toolkit: "toolkit/dsec-guest:1", Tiers: []string{"container", "vm"}},
		{Name: "fn:1", Layers: []api.ImageLayer{{Role: "base", ID: "base/busybox:1"}, {Role: "data", ID: "sha256:dd"}, {Role: "extra", ID: "x/y:2"}}},
	}
	if diff := cmp.Diff(want, s.creates); diff != "" {
		t.Errorf("requests mismatch (-want +got):\n%s", diff)
	}

	for _, argv := range [][]string{
		{"image", "create", "x:1"},
		{"image", "create", "x:1", "--layer", "base"},
		{"image", "create", "x:1", "--layer", "=ref"},
		{"image", "create", "--base", "b:1"},
	} {
		if res := dsec(t, h, argv...); res.code != exitUsage {
			t.Errorf("%v: %+v, want a usage error", argv, res)
		}
	}
	if len(s.creates) != 2 {
		t.Errorf("bad command lines reached the server: %+v", s.creates[2:])
	}
}

func TestImageInspectTagRemove(t *testing.T) {
	var s imageServer
	h := s.handler(t)

	// inspect prints JSON without --json.
	res := dsec(t, h, "image", "inspect", "team/py:3.12")
	var img api.Image
	if err := json.Unmarshal([]byte(res.stdout), &img); err != nil || res.code != 0 || img.Name != "team/py:3.12" {
		t.Errorf("inspect: %+v (%v)", res, err)
	}
	res = dsec(t, h, "image", "inspect", "missing:1")
	if res.code != exitError || res.stderr != "dsec: no image missing:1 (image_not_found)\n" {
		t.Errorf("inspect missing: %+v", res)
	}

	res = dsec(t, h, "image", "tag", "sha256:feed", "team/py:latest")
	if res.code != 0 || res.stdout != "sha256:feed\n" {
		t.Errorf("tag: %+v", res)
	}
	if diff := cmp.Diff([]api.TagRequest{{Image: "sha256:feed", Name: "team/py:latest"}}, s.tags); diff != "" {
		t.Errorf("tag request mismatch (-want +got):\n%s", diff)
	}

	res = dsec(t, h, "image", "rm", "team/py:3.12", "sha256:feed", "b:2")
	if res.code != exitError || res.stdout != "team/py:3.12\nb:2\n" ||
		res.stderr != "dsec: sha256:feed: image is used by a live sandbox (image_in_use)\n" {
		t.Errorf("rm: %+v", res)
	}
	want := []string{"GET team/py:3.12", "GET missing:1", "DELETE team/py:3.12", "DELETE sha256:feed", "DELETE b:2"}
	if diff := cmp.Diff(want, s.seen); diff != "" {
		t.Errorf("requests mismatch (-want +got):\n%s", diff)
	}
}

func TestImageAddDir(t *testing.T) {
	var s imageServer
	res := dsec(t, s.handler(t), "image", "add-dir", "py", "rel/root", "--tier", "container", "--tier", "vm")
	abs, _ := filepath.Abs("rel/root")
	if res.code != 0 || res.stdout != "sha256:d1\n" {
		t.Errorf("add-dir: %+v", res)
	}
	if diff := cmp.Diff([]api.AddDirImageRequest{{Name: "py", Path: abs, Tiers: []string{"container", "vm"}}}, s.added); diff != "" {
		t.Errorf("request mismatch (-want +got):\n%s", diff)
	}
}
