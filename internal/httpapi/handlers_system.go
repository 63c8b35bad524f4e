package httpapi

import (
	"net/http"
	"sync"
	"time"

	"sigs.k8s.io/yaml"

	wire "github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// health is ready when at least one node heartbeats.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	n := 0
	for _, node := range s.mgr.Nodes() {
		if node.Ready && time.Since(node.LastSeen) < 30*time.Second {
			n++
		}
	}
	if n == 0 {
		s.writeError(w, r, &errdefs.Error{Class: errdefs.Unavailable, Code: wire.CodeNoNodes, Msg: "no node is connected yet", RetryAfter: time.Second})
		return
	}
	writeJSON(w, http.StatusOK, wire.Health{Status: "ok", Nodes: n})
}

func (s *Server) openapi(w http.ResponseWriter, r *http.Request) {
	b, err := openAPIJSON()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func (s *Server) version(w http.ResponseWriter, r *http.Request, _ string) {
	writeJSON(w, http.StatusOK, s.opt.Version)
}

func (s *Server) nodes(w http.ResponseWriter, r *http.Request, _ string) {
	nodes := s.mgr.Nodes()
	if nodes == nil {
		nodes = []wire.Node{}
	}
	writeJSON(w, http.StatusOK, wire.NodeList{Nodes: nodes})
}

// openAPIJSON is the OpenAPI document converted to JSON once.
var openAPIJSON = sync.OnceValues(func() ([]byte, error) { return yaml.YAMLToJSON(wire.OpenAPIYAML()) })

func (s *Server) cordonNode(w http.ResponseWriter, r *http.Request, _ string) {
	n, err := s.mgr.Cordon(r.Context(), r.PathValue("node"), true)
	s.writeNode(w, r, n, err)
}

func (s *Server) uncordonNode(w http.ResponseWriter, r *http.Request, _ string) {
	n, err := s.mgr.Cordon(r.Context(), r.PathValue("node"), false)
	s.writeNode(w, r, n, err)
}

// drainNode takes an optional body (no body: the default deadline).
func (s *Server) drainNode(w http.ResponseWriter, r *http.Request, _ string) {
	var req wire.DrainRequest
	if r.ContentLength != 0 {
		if err := s.decode(w, r, &req); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	n, err := s.mgr.Drain(r.Context(), r.PathValue("node"), req)
	s.writeNode(w, r, n, err)
}

func (s *Server) writeNode(w http.ResponseWriter, r *http.Request, n wire.Node, err error) {
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, n)
}
