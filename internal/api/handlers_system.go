package api

import (
	"net/http"
	"time"

	wire "github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image"
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
		s.writeError(w, r, &errdefs.Error{Class: errdefs.Unavailable, Code: "no_nodes", Msg: "no node is connected yet", RetryAfter: time.Second})
		return
	}
	writeJSON(w, http.StatusOK, wire.Health{Status: "ok", Nodes: n})
}

func (s *Server) openapi(w http.ResponseWriter, r *http.Request) {
	b, err := wire.OpenAPIJSON()
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

func (s *Server) listImages(w http.ResponseWriter, r *http.Request, _ string) {
	imgs, err := s.opt.Images.List(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.ImageList{Images: imgs})
}

func (s *Server) addDirImage(w http.ResponseWriter, r *http.Request, _ string) {
	if !s.opt.AllowDirImages {
		s.writeError(w, r, errdefs.New(errdefs.PermissionDenied, "dir_images_disabled", "directory images are disabled on this server"))
		return
	}
	var req wire.AddDirImageRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	rec, err := s.opt.Images.AddDir(r.Context(), req.Name, req.Path, req.Tiers)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, image.ToAPI(rec))
}
