package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
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
)

// fileServer keeps the files of sandbox sb-1 in memory and records how
// uploads arrived.
type fileServer struct {
	mu      sync.Mutex
	files   map[string][]byte
	uploads []upload
}

type upload struct {
	path          string
	contentLength int64
	chunked       bool
	mode          string
}

func (s *fileServer) handler(t *testing.T) http.Handler {
	s.files = map[string][]byte{}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/sandboxes/sb-1/files", func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("path")
		var buf bytes.Buffer
		if _, err := io.CopyBuffer(&buf, r.Body, make([]byte, 32<<10)); err != nil {
			t.Error(err)
		}
		s.mu.Lock()
		s.files[p] = buf.Bytes()
		s.uploads = append(s.uploads, upload{p, r.ContentLength, len(r.TransferEncoding) > 0, r.URL.Query().Get("mode")})
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, api.FileInfo{Name: filepath.Base(p), Path: p, Type: api.FileTypeFile, Size: int64(buf.Len()), Mode: 0o644})
	})
	mux.HandleFunc("GET /v1/sandboxes/sb-1/files", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		b, ok := s.files[r.URL.Query().Get("path")]
		s.mu.Unlock()
		if !ok {
			writeError(w, http.StatusNotFound, "file_not_found", "not_found", "no such file")
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = io.Copy(w, bytes.NewReader(b))
	})
	mux.HandleFunc("GET /v1/sandboxes/sb-1/files/stat", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		b, ok := s.files[r.URL.Query().Get("path")]
		s.mu.Unlock()
		if !ok {
			writeError(w, http.StatusNotFound, "file_not_found", "not_found", "no such file")
			return
		}
		writeJSON(w, http.StatusOK, api.FileInfo{Size: int64(len(b))})
	})
	return mux
}

func TestFilesPutGetRoundTrip(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 3<<20+17)
	for i := range data {
		data[i] = byte(rand.N(256))
	}
	local := filepath.Join(dir, "data.bin")
	if err := os.WriteFile(local, data, 0o755); err != nil {
		t.Fatal(err)
	}
	var s fileServer
	h := s.handler(t)

	if res := dsec(t, h, "files", "put", "sb-1", local, "/w/data.bin"); res.code != 0 || res.stdout != "" || res.stderr != "" {
		t.Fatalf("put: %+v", res)
	}
	if res := dsec(t, h, "files", "get", "sb-1", "/w/data.bin", filepath.Join(dir, "back.bin")); res.code != 0 {
		t.Fatalf("get: %+v", res)
	}
	back, err := os.ReadFile(filepath.Join(dir, "back.bin"))
	if err != nil || !bytes.Equal(back, data) {
		t.Fatalf("round trip changed the data (%d bytes back, %v)", len(back), err)
	}

	// Into a directory, keeping the remote name.
	if res := dsec(t, h, "files", "get", "sb-1", "/w/data.bin", t.TempDir()); res.code != 0 {
		t.Fatalf("get into a directory: %+v", res)
	}

	// From standard input to standard output.
	res := invocation{env: testEnv(t, nil), stdin: "piped"}.run(t, h, "files", "put", "sb-1", "-", "/w/piped")
	if res.code != 0 {
		t.Fatalf("put -: %+v", res)
	}
	if res := dsec(t, h, "files", "get", "sb-1", "/w/piped", "-"); res.stdout != "piped" {
		t.Errorf("get - printed %q", res.stdout)
	}
	if res := dsec(t, h, "files", "cat", "sb-1", "/w/piped"); res.stdout != "piped" {
		t.Errorf("cat printed %q", res.stdout)
	}

	want := []upload{
		{path: "/w/data.bin", contentLength: int64(len(data)), mode: "0755"},
		{path: "/w/piped", contentLength: -1, chunked: true},
	}
	if diff := cmp.Diff(want, s.uploads, cmp.AllowUnexported(upload{})); diff != "" {
		t.Errorf("uploads mismatch (-want +got):\n%s", diff)
	}
}

func TestFilesGetMissingKeepsLocal(t *testing.T) {
	var s fileServer
	local := filepath.Join(t.TempDir(), "keep")
	if err := os.WriteFile(local, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := dsec(t, s.handler(t), "files", "get", "sb-1", "/nope", local)
	if res.code != exitError || res.stderr != "dsec: no such file (file_not_found)\n" {
		t.Errorf("got %+v", res)
	}
	if b, _ := os.ReadFile(local); string(b) != "old" {
		t.Errorf("local file now %q, want it untouched", b)
	}
}

func TestFilesProgress(t *testing.T) {
	local := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(local, bytes.Repeat([]byte("x"), 2048), 0o644); err != nil {
		t.Fatal(err)
	}
	var s fileServer
	h := s.handler(t)
	e := testEnv(t, nil)
	e.isTerminal = func(io.Writer) bool { return true }
	clock := testNow
	e.now = func() time.Time { clock = clock.Add(500 * time.Millisecond); return clock }

	res := invocation{env: e}.run(t, h, "files", "put", "sb-1", local, "/w/f")
	final := regexp.MustCompile(`\r/w/f  2\.0 KiB / 2\.0 KiB \(100%\)  [0-9.]+ KiB/s  [0-9.]+s\x1b\[K\n$`)
	if res.code != 0 || !final.MatchString(res.stderr) {
		t.Errorf("put on a terminal: %+v", res)
	}
	res = invocation{env: e}.run(t, h, "--json", "files", "put", "sb-1", local, "/w/f")
	var fi api.FileInfo
	if res.code != 0 || res.stderr != "" || json.Unmarshal([]byte(res.stdout), &fi) != nil || fi.Size != 2048 {
		t.Errorf("put --json on a terminal: %+v", res)
	}
	res = invocation{env: e}.run(t, h, "files", "get", "sb-1", "/w/f", filepath.Join(t.TempDir(), "g"))
	if res.code != 0 || !strings.Contains(res.stderr, "2.0 KiB / 2.0 KiB (100%)") {
		t.Errorf("get on a terminal: %+v", res)
	}
}

func TestFilesOtherCommands(t *testing.T) {
	var seen []string
	mux := http.NewServeMux()
	record := func(r *http.Request) {
		seen = append(seen, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
	}
	mtime := time.Date(2026, 2, 3, 4, 5, 6, 0, time.Local)
	mux.HandleFunc("GET /v1/sandboxes/sb-1/files/list", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		writeJSON(w, http.StatusOK, api.FileList{Entries: []api.FileInfo{
			{Name: "src", Path: "/w/src", Type: api.FileTypeDir, Size: 4096, Mode: 0o755, ModTime: mtime},
			{Name: "main.py", Path: "/w/main.py", Type: api.FileTypeFile, Size: 120, Mode: 0o644, ModTime: mtime},
			{Name: "lib", Path: "/w/lib", Type: api.FileTypeSymlink, Mode: 0o777, ModTime: mtime, Target: "/usr/lib"},
		}})
	})
	mux.HandleFunc("DELETE /v1/sandboxes/sb-1/files", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/sandboxes/sb-1/files/mkdir", func(w http.ResponseWriter, r *http.Request) {
		var req api.MkdirRequest
		decode(t, r, &req)
		seen = append(seen, "mkdir "+req.Path+" "+map[bool]string{true: "-p", false: ""}[req.Parents])
		writeJSON(w, http.StatusCreated, api.FileInfo{Path: req.Path, Type: api.FileTypeDir})
	})

	res := dsec(t, mux, "files", "ls", "sb-1", "/w")
	want := `MODE        SIZE  MODIFIED             NAME
drwxr-xr-x  4096  2026-02-03 04:05:06  src/
-rw-r--r--  120   2026-02-03 04:05:06  main.py
Lrwxrwxrwx  0     2026-02-03 04:05:06  lib -> /usr/lib
`
	if diff := cmp.Diff(want, res.stdout); diff != "" || res.code != 0 {
		t.Errorf("ls (exit %d) mismatch (-want +got):\n%s", res.code, diff)
	}
	dsec(t, mux, "files", "ls", "--depth", "2", "sb-1", "/w")
	dsec(t, mux, "files", "rm", "-r", "sb-1", "/w/src")
	dsec(t, mux, "files", "rm", "sb-1", "/w/main.py")
	dsec(t, mux, "files", "mkdir", "-p", "sb-1", "/w/a/b")
	wantSeen := []string{
		"GET /v1/sandboxes/sb-1/files/list?path=%2Fw",
		"GET /v1/sandboxes/sb-1/files/list?path=%2Fw&depth=2",
		"DELETE /v1/sandboxes/sb-1/files?path=%2Fw%2Fsrc&recursive=true",
		"DELETE /v1/sandboxes/sb-1/files?path=%2Fw%2Fmain.py",
		"mkdir /w/a/b -p",
	}
	if diff := cmp.Diff(wantSeen, seen); diff != "" {
		t.Errorf("requests mismatch (-want +got):\n%s", diff)
	}
}
