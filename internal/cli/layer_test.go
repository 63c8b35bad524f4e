package cli

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client/tardir"
	"github.com/dsec-dev/dsec/internal/sys"
)

// layerUpload is what the fake server saw of one POST /v1/layers.
type layerUpload struct {
	Kind, Name    string
	ContentType   string
	ContentLength int64
	Chunked       bool
	Body          []byte
}

// layerServer answers the layer endpoints and records what it was asked.
type layerServer struct {
	mu      sync.Mutex
	uploads []layerUpload
	dirs    []api.BuildDirLayerRequest
	seen    []string
}

func (s *layerServer) handler(t *testing.T) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/layers", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			// The client gave up on the upload (tests that expect it check
			// its error; the others would miss the upload).
			writeError(w, http.StatusBadRequest, "bad_body", "invalid_argument", err.Error())
			return
		}
		q := r.URL.Query()
		s.mu.Lock()
		s.uploads = append(s.uploads, layerUpload{q.Get("kind"), q.Get("name"), r.Header.Get("Content-Type"), r.ContentLength, len(r.TransferEncoding) > 0, body})
		s.mu.Unlock()
		var names []string
		if q.Get("name") != "" {
			names = []string{q.Get("name")}
		}
		writeJSON(w, http.StatusCreated, api.Layer{ID: "sha256:1a2b3c4d5e6f7a8b9c", Names: names, SourceKind: q.Get("kind")})
	})
	mux.HandleFunc("POST /v1/layers/dir", func(w http.ResponseWriter, r *http.Request) {
		var req api.BuildDirLayerRequest
		decode(t, r, &req)
		s.dirs = append(s.dirs, req)
		writeJSON(w, http.StatusCreated, api.Layer{ID: "sha256:d1", Names: []string{req.Name}, SourceKind: "dir"})
	})
	mux.HandleFunc("GET /v1/layers", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.LayerList{Layers: []api.Layer{
			{ID: "sha256:0123456789abcdef0123", Names: []string{"base/busybox:1.36.1-2", "base/busybox:latest"}, MetaSize: 12 << 10, BlobSize: 3 << 20,
				SourceKind: "dir", Builder: "dsec/erofs-1", CreatedAt: testNow.Add(-3 * time.Hour)},
			{ID: "sha256:ffff", MetaSize: 512, SourceKind: "oci", CreatedAt: testNow.Add(-30 * time.Second)},
		}})
	})
	mux.HandleFunc("GET /v1/layers/{ref...}", func(w http.ResponseWriter, r *http.Request) {
		s.seen = append(s.seen, "GET "+r.PathValue("ref"))
		writeJSON(w, http.StatusOK, api.Layer{ID: "sha256:0123", Names: []string{r.PathValue("ref")}})
	})
	mux.HandleFunc("DELETE /v1/layers/{ref...}", func(w http.ResponseWriter, r *http.Request) {
		s.seen = append(s.seen, "DELETE "+r.PathValue("ref"))
		if r.PathValue("ref") == "base/busybox:1" {
			writeError(w, http.StatusConflict, "layer_in_use", "conflict", "layer is used by image fn:1")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// writeTree makes files (path → content; a path ending in / is a
// directory) under dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, data := range files {
		full := filepath.Join(dir, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// tarFile writes a tar of files (name → content, in order) to path,
// gzip-compressed if gz.
func tarFile(t *testing.T, path string, gz bool, files ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for i := 0; i < len(files); i += 2 {
		if err := tw.WriteHeader(&tar.Header{Name: files[i], Mode: 0o644, Size: int64(len(files[i+1])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(files[i+1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestLayerBuildSources(t *testing.T) {
	tmp := t.TempDir()
	ws := filepath.Join(tmp, "ws")
	writeTree(t, ws, map[string]string{"src/main.py": "print(1)\n", "README": "hi\n", "empty/": ""})
	var wsTar bytes.Buffer
	if err := tardir.Write(ws, &wsTar); err != nil {
		t.Fatal(err)
	}
	layout := filepath.Join(tmp, "layout")
	writeTree(t, layout, map[string]string{"oci-layout": `{"imageLayoutVersion":"1.0.0"}`, "index.json": "{}", "blobs/sha256/": ""})
	plain := tarFile(t, filepath.Join(tmp, "plain.tar"), false, "etc/hosts", "127.0.0.1 localhost\n")
	gz := tarFile(t, filepath.Join(tmp, "plain.tar.gz"), true, "./manifest.jsonx", "not at the top", "a/manifest.json", "nor this")
	docker := tarFile(t, filepath.Join(tmp, "docker.tar"), false, "abc/layer.tar", strings.Repeat("x", 4000), "./manifest.json", "[]")
	ociTar := tarFile(t, filepath.Join(tmp, "oci.tar.gz"), true, "oci-layout", "{}", "index.json", "{}")

	var s layerServer
	h := s.handler(t)
	for _, argv := range [][]string{
		{"layer", "build", ws, "--name", "team/ws:1"},
		{"layer", "build", layout},
		{"layer", "build", filepath.Join(tmp, "plain.tar"), "--name", "etc:1"},
		{"layer", "build", filepath.Join(tmp, "plain.tar.gz")},
		{"layer", "build", filepath.Join(tmp, "docker.tar")},
		{"layer", "build", filepath.Join(tmp, "oci.tar.gz")},
		{"layer", "build", filepath.Join(tmp, "docker.tar"), "--kind", "tar"},
	} {
		res := dsec(t, h, argv...)
		if res.code != 0 || res.stdout != "sha256:1a2b3c4d5e6f7a8b9c\n" || res.stderr != "" {
			t.Errorf("%v: %+v", argv, res)
		}
	}
	chunked := func(kind, name string, body []byte) layerUpload {
		return layerUpload{kind, name, "application/x-tar", -1, true, body}
	}
	sized := func(kind, name string, body []byte) layerUpload {
		return layerUpload{kind, name, "application/x-tar", int64(len(body)), false, body}
	}
	var layoutTar bytes.Buffer
	if err := tardir.Write(layout, &layoutTar); err != nil {
		t.Fatal(err)
	}
	want := []layerUpload{
		chunked("tar", "team/ws:1", wsTar.Bytes()),
		chunked("oci", "", layoutTar.Bytes()),
		sized("tar", "etc:1", plain),
		sized("tar", "", gz),
		sized("oci", "", docker),
		sized("oci", "", ociTar),
		sized("tar", "", docker),
	}
	if diff := cmp.Diff(want, s.uploads); diff != "" {
		t.Errorf("uploads mismatch (-want +got):\n%s", diff)
	}
}

func TestLayerBuildLocal(t *testing.T) {
	var s layerServer
	h := s.handler(t)
	dir := t.TempDir()
	rel, err := filepath.Rel(mustGetwd(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	res := dsec(t, h, "--json", "layer", "build", "--local", rel, "--name", "ws:2")
	var l api.Layer
	if err := json.Unmarshal([]byte(res.stdout), &l); err != nil || res.code != 0 || l.ID != "sha256:d1" {
		t.Errorf("build --local --json: %+v (%v)", res, err)
	}
	if diff := cmp.Diff([]api.BuildDirLayerRequest{{Path: dir, Name: "ws:2"}}, s.dirs); diff != "" {
		t.Errorf("request mismatch (-want +got):\n%s", diff)
	}

	// Refused here: a file, an OCI layout, a bad kind.
	file := filepath.Join(dir, "f.tar")
	tarFile(t, file, false, "a", "b")
	layout := filepath.Join(t.TempDir(), "layout")
	writeTree(t, layout, map[string]string{"oci-layout": "{}"})
	for _, argv := range [][]string{
		{"layer", "build", "--local", file},
		{"layer", "build", "--local", layout},
		{"layer", "build", "--kind", "zip", dir},
	} {
		if res := dsec(t, h, argv...); res.code != exitUsage {
			t.Errorf("%v: %+v, want a usage error", argv, res)
		}
	}
	if res := dsec(t, h, "layer", "build", filepath.Join(dir, "missing")); res.code != exitError || !strings.Contains(res.stderr, "no such file") {
		t.Errorf("build of a missing path: %+v", res)
	}
	if len(s.uploads) != 0 || len(s.dirs) != 1 {
		t.Errorf("refused builds reached the server: %+v %+v", s.uploads, s.dirs)
	}
}

func mustGetwd(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

func TestLayerBuildRefusesSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"a": strings.Repeat("a", 1<<20)})
	if err := sys.Mknod(filepath.Join(dir, "z-fifo"), sys.ModeFifo|0o644, 0, 0); err != nil {
		t.Skipf("cannot make a FIFO: %v", err)
	}
	var s layerServer
	res := dsec(t, s.handler(t), "layer", "build", dir)
	if res.code != exitError || !strings.Contains(res.stderr, "dsec: packing "+dir+": ") ||
		!strings.Contains(res.stderr, "z-fifo (FIFO): device nodes, FIFOs and sockets cannot go into a layer") {
		t.Errorf("build of a tree with a FIFO: %+v", res)
	}
}

func TestLayerBuildProgress(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"big": strings.Repeat("x", 3000)})
	file := filepath.Join(t.TempDir(), "l.tar")
	data := tarFile(t, file, false, "f", strings.Repeat("y", 5000))
	var s layerServer
	h := s.handler(t)
	e := testEnv(t, nil)
	e.isTerminal = func(io.Writer) bool { return true }
	clock := testNow
	e.now = func() time.Time { clock = clock.Add(500 * time.Millisecond); return clock }

	res := invocation{env: e}.run(t, h, "layer", "build", file)
	final := regexp.MustCompile(`\rl\.tar  ` + regexp.QuoteMeta(humanBytes(int64(len(data)))) + ` / ` + regexp.QuoteMeta(humanBytes(int64(len(data)))) +
		` \(100%\)  [0-9.]+ KiB/s  [0-9.]+s\x1b\[K\n$`)
	if res.code != 0 || !final.MatchString(res.stderr) || res.stdout != "sha256:1a2b3c4d5e6f7a8b9c\n" {
		t.Errorf("build of a file on a terminal: %q %+v", final, res)
	}
	res = invocation{env: e}.run(t, h, "layer", "build", dir)
	dirLine := regexp.MustCompile(`\r` + regexp.QuoteMeta(filepath.Base(dir)) + `  [0-9.]+ KiB  [0-9.]+ KiB/s  [0-9.]+s\x1b\[K\n$`)
	if res.code != 0 || !dirLine.MatchString(res.stderr) {
		t.Errorf("build of a directory on a terminal: %+v", res)
	}

	// --json, or no terminal: no progress.
	for _, inv := range []struct {
		env  env
		argv []string
	}{
		{e, []string{"--json", "layer", "build", file}},
		{e, []string{"--json", "layer", "build", dir}},
		{testEnv(t, nil), []string{"layer", "build", dir}},
	} {
		res := invocation{env: inv.env}.run(t, h, inv.argv...)
		if res.code != 0 || res.stderr != "" {
			t.Errorf("%v: %+v, want no progress", inv.argv, res)
		}
	}
}

func TestLayerListInspectRemove(t *testing.T) {
	var s layerServer
	h := s.handler(t)
	res := dsec(t, h, "layer", "ls")
	want := `ID            NAMES                                      META      BLOB     SOURCE  BUILDER       AGE
0123456789ab  base/busybox:1.36.1-2,base/busybox:latest  12.0 KiB  3.0 MiB  dir     dsec/erofs-1  3h
sha256:ffff   -                                          512 B     0 B      oci     -             30s
`
	if diff := cmp.Diff(want, res.stdout); diff != "" || res.code != 0 {
		t.Errorf("ls (exit %d) mismatch (-want +got):\n%s", res.code, diff)
	}
	res = dsec(t, h, "--json", "layer", "ls")
	var l api.LayerList
	if err := json.Unmarshal([]byte(res.stdout), &l); err != nil || len(l.Layers) != 2 {
		t.Errorf("ls --json: %+v (%v)", res, err)
	}

	res = dsec(t, h, "layer", "inspect", "toolkit/wasm-tools:0a1b")
	var got api.Layer
	if err := json.Unmarshal([]byte(res.stdout), &got); err != nil || res.code != 0 || got.Names[0] != "toolkit/wasm-tools:0a1b" {
		t.Errorf("inspect: %+v (%v)", res, err)
	}

	res = dsec(t, h, "layer", "rm", "ws:1", "base/busybox:1", "sha256:0123")
	if res.code != exitError || res.stdout != "ws:1\nsha256:0123\n" ||
		res.stderr != "dsec: base/busybox:1: layer is used by image fn:1 (layer_in_use)\n" {
		t.Errorf("rm: %+v", res)
	}
	wantSeen := []string{"GET toolkit/wasm-tools:0a1b", "DELETE ws:1", "DELETE base/busybox:1", "DELETE sha256:0123"}
	if diff := cmp.Diff(wantSeen, s.seen); diff != "" {
		t.Errorf("requests mismatch (-want +got):\n%s", diff)
	}
}
