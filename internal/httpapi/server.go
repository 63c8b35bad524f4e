// Package httpapi is DSec's REST API v1 edge: routing, bearer-token auth,
// request decoding and limits, and the one place where error classes
// become HTTP statuses. Handlers translate between HTTP and the control
// plane; they hold no state of their own.
package httpapi

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	wire "github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/auth"
	"github.com/dsec-dev/dsec/internal/controlplane"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image"
	"github.com/dsec-dev/dsec/internal/metrics"
)

// Options configure the server.
type Options struct {
	Manager *controlplane.Manager
	Images  *image.Registry
	Auth    *auth.Checker
	Metrics *metrics.Metrics
	Logger  *slog.Logger
	Version wire.VersionInfo
	// MaxBodyBytes caps JSON request bodies (1 MiB).
	MaxBodyBytes int64
	// MaxFileBytes caps uploads (4 GiB).
	MaxFileBytes int64
	// MaxLayerBytes caps layer archive uploads (32 GiB).
	MaxLayerBytes int64
	// AllowDirImages enables POST /v1/images/dir (operator convenience).
	AllowDirImages bool
}

// Server serves the API. It is safe for concurrent use.
type Server struct {
	opt Options
	mgr *controlplane.Manager
	log *slog.Logger
	mux *http.ServeMux
}

// New returns a server; Handler serves it.
func New(opt Options) *Server {
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.MaxBodyBytes == 0 {
		opt.MaxBodyBytes = 1 << 20
	}
	if opt.MaxFileBytes == 0 {
		opt.MaxFileBytes = 4 << 30
	}
	if opt.MaxLayerBytes == 0 {
		opt.MaxLayerBytes = 32 << 30
	}
	s := &Server{opt: opt, mgr: opt.Manager, log: opt.Logger.With("component", "api"), mux: http.NewServeMux()}
	s.routes()
	return s
}

// Handler is the server's root handler.
func (s *Server) Handler() http.Handler { return s }

func (s *Server) routes() {
	pub := func(pattern string, h http.HandlerFunc) { s.mux.Handle(pattern, h) }
	priv := func(pattern string, h func(http.ResponseWriter, *http.Request, string)) {
		s.mux.Handle(pattern, s.authed(h))
	}
	pub("GET /v1/health", s.health)
	pub("GET /v1/openapi.json", s.openapi)
	pub("GET /metrics", promhttp.HandlerFor(s.opt.Metrics.Registry, promhttp.HandlerOpts{}).ServeHTTP)
	priv("GET /v1/version", s.version)
	priv("GET /v1/nodes", s.nodes)
	priv("POST /v1/nodes/{node}/cordon", s.cordonNode)
	priv("POST /v1/nodes/{node}/uncordon", s.uncordonNode)
	priv("POST /v1/nodes/{node}/drain", s.drainNode)
	priv("GET /v1/images", s.listImages)
	priv("POST /v1/images", s.createImage)
	priv("POST /v1/images/dir", s.addDirImage)
	priv("POST /v1/images/tag", s.tagImage)
	priv("GET /v1/images/{ref...}", s.getImage)
	priv("DELETE /v1/images/{ref...}", s.deleteImage)
	priv("GET /v1/layers", s.listLayers)
	priv("POST /v1/layers", s.importLayer)
	priv("POST /v1/layers/dir", s.buildDirLayer)
	priv("GET /v1/layers/{ref...}", s.getLayer)
	priv("DELETE /v1/layers/{ref...}", s.deleteLayer)
	priv("POST /v1/sandboxes", s.createSandbox)
	priv("GET /v1/sandboxes", s.listSandboxes)
	priv("GET /v1/sandboxes/{id}", s.getSandbox)
	priv("DELETE /v1/sandboxes/{id}", s.deleteSandbox)
	priv("POST /v1/sandboxes/{id}/timeout", s.setTimeout)
	priv("POST /v1/sandboxes/{id}/phase", s.setPhase)
	priv("GET /v1/sandboxes/{id}/events", s.auditEvents)
	priv("GET /v1/sandboxes/{id}/events/stream", s.auditEventsStream)
	priv("GET /v1/sandboxes/{id}/integrity", s.integrity)
	priv("POST /v1/sandboxes/{id}/grade", s.grade)
	priv("GET /v1/sandboxes/{id}/stats", s.sandboxStats)
	priv("POST /v1/sandboxes/{id}/exec", s.exec)
	priv("POST /v1/sandboxes/{id}/exec/stream", s.execStream)
	priv("GET /v1/sandboxes/{id}/exec/ws", s.execWS)
	priv("POST /v1/sandboxes/{id}/processes", s.startProcess)
	priv("GET /v1/sandboxes/{id}/processes", s.listProcesses)
	priv("GET /v1/sandboxes/{id}/processes/{pid}", s.getProcess)
	priv("POST /v1/sandboxes/{id}/processes/{pid}/wait", s.waitProcess)
	priv("POST /v1/sandboxes/{id}/processes/{pid}/stdin", s.sendStdin)
	priv("POST /v1/sandboxes/{id}/processes/{pid}/stdin/close", s.closeStdin)
	priv("POST /v1/sandboxes/{id}/processes/{pid}/kill", s.killProcess)
	priv("GET /v1/sandboxes/{id}/files", s.readFile)
	priv("PUT /v1/sandboxes/{id}/files", s.writeFile)
	priv("DELETE /v1/sandboxes/{id}/files", s.removeFile)
	priv("GET /v1/sandboxes/{id}/files/list", s.listFiles)
	priv("GET /v1/sandboxes/{id}/files/stat", s.statFile)
	priv("GET /v1/sandboxes/{id}/files/exists", s.existsFile)
	priv("POST /v1/sandboxes/{id}/files/mkdir", s.mkdir)
	priv("POST /v1/sandboxes/{id}/files/rename", s.rename)
	priv("POST /v1/sandboxes/{id}/snapshot", s.snapshotSandbox)
	priv("POST /v1/sandboxes/{id}/fork", s.forkSandbox)
	priv("GET /v1/snapshots/{id}", s.getSnapshot)
	priv("DELETE /v1/snapshots/{id}", s.deleteSnapshot)
	priv("GET /v1/trajectories", s.listTrajectories)
	priv("GET /v1/trajectories/{id}", s.getTrajectory)
	priv("DELETE /v1/trajectories/{id}", s.deleteTrajectory)
	priv("GET /v1/trajectories/{id}/steps", s.trajectorySteps)
	priv("GET /v1/trajectories/{id}/export", s.exportTrajectory)
	priv("GET /v1/trajectories/{id}/blobs/{digest}", s.trajectoryBlob)
	priv("POST /v1/trajectories/{id}/resume", s.resumeTrajectory)
}

// ServeHTTP adds a request ID, recovers panics, and records metrics.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rid := r.Header.Get("X-Request-Id")
	if rid == "" || len(rid) > 64 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		rid = hex.EncodeToString(b[:])
	}
	w.Header().Set("X-Request-Id", rid)
	rw := &statusWriter{ResponseWriter: w}
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			s.log.Error("panic in handler", "path", r.URL.Path, "panic", p, "stack", string(debug.Stack()), "request_id", rid)
			if !rw.wrote {
				s.writeError(rw, r, errdefs.New(errdefs.Internal, wire.CodeInternal, "internal error"))
			}
		}
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		} else if _, p, ok := strings.Cut(route, " "); ok {
			route = p
		}
		s.opt.Metrics.Request(route, r.Method, strconv.Itoa(rw.code()), time.Since(start))
	}()
	_, pattern := s.mux.Handler(r)
	if pattern == "" {
		s.writeError(rw, r, errdefs.New(errdefs.NotFound, wire.CodeRouteNotFound, "no route for %s %s", r.Method, r.URL.Path))
		return
	}
	s.mux.ServeHTTP(rw, r)
}

// authed checks the bearer token and passes the owner and the path's
// sandbox ID to h.
func (s *Server) authed(h func(http.ResponseWriter, *http.Request, string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		owner, valid := "", false
		if ok {
			owner, valid = s.opt.Auth.Check(strings.TrimSpace(tok))
		}
		if !valid {
			w.Header().Set("WWW-Authenticate", `Bearer realm="dsec"`)
			s.writeError(w, r, errdefs.New(errdefs.Unauthenticated, wire.CodeUnauthenticated, "missing or invalid bearer token (dsec token prints it)"))
			return
		}
		if _, err := url.ParseQuery(r.URL.RawQuery); err != nil {
			s.writeError(w, r, errdefs.New(errdefs.Invalid, wire.CodeInvalidQuery, "the query string is not valid: %v", err))
			return
		}
		h(w, r, owner)
	})
}

// statusWriter remembers the status for metrics and whether anything was
// written. It passes Flush through for streaming.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.status, w.wrote = http.StatusOK, true
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController and websocket reach the original.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) code() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}
