package httpapi

import (
	"errors"
	"net/http"

	wire "github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image"
	"github.com/dsec-dev/dsec/internal/image/layer"
)

func (s *Server) listImages(w http.ResponseWriter, r *http.Request, _ string) {
	imgs, err := s.opt.Images.List(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.ImageList{Images: imgs})
}

func (s *Server) getImage(w http.ResponseWriter, r *http.Request, _ string) {
	res, err := s.opt.Images.Resolve(r.Context(), r.PathValue("ref"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, image.APIOf(res))
}

func (s *Server) createImage(w http.ResponseWriter, r *http.Request, _ string) {
	var req wire.CreateImageRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	layers := req.Layers
	if len(layers) > 0 && (req.Base != "" || req.Workspace != "" || req.Toolkit != "") {
		s.writeError(w, r, errdefs.New(errdefs.Invalid, wire.CodeInvalidLayers, "give layers, or base/workspace/toolkit, not both"))
		return
	}
	for _, l := range []wire.ImageLayer{{Role: image.RoleBase, ID: req.Base}, {Role: image.RoleWorkspace, ID: req.Workspace}, {Role: image.RoleToolkit, ID: req.Toolkit}} {
		if l.ID != "" {
			layers = append(layers, l)
		}
	}
	res, err := s.opt.Images.Create(r.Context(), req.Name, layers, req.Tiers)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, image.APIOf(res))
}

func (s *Server) tagImage(w http.ResponseWriter, r *http.Request, _ string) {
	var req wire.TagRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.opt.Images.Tag(r.Context(), req.Image, req.Name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, image.APIOf(res))
}

func (s *Server) deleteImage(w http.ResponseWriter, r *http.Request, _ string) {
	ref := r.PathValue("ref")
	if layer.ValidDigest(ref) && s.mgr.ImageInUse(ref) {
		s.writeError(w, r, errdefs.New(errdefs.Conflict, wire.CodeImageInUse, "image %s is used by a live sandbox", ref))
		return
	}
	if err := s.opt.Images.Remove(r.Context(), ref); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) addDirImage(w http.ResponseWriter, r *http.Request, _ string) {
	if !s.opt.AllowDirImages {
		s.writeError(w, r, errdefs.New(errdefs.PermissionDenied, wire.CodeDirImagesDisabled, "directory images and layers are disabled on this server"))
		return
	}
	var req wire.AddDirImageRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.opt.Images.AddDir(r.Context(), req.Name, req.Path, req.Tiers)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, image.APIOf(res))
}

func (s *Server) listLayers(w http.ResponseWriter, r *http.Request, _ string) {
	ls, err := s.opt.Images.ListLayers(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.LayerList{Layers: ls})
}

func (s *Server) getLayer(w http.ResponseWriter, r *http.Request, _ string) {
	rec, err := s.opt.Images.ResolveLayer(r.Context(), r.PathValue("ref"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	names, err := s.opt.Images.LayerNames(r.Context(), rec.ID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, image.LayerToAPI(rec, names))
}

// importLayer builds a layer from the request body: a tar stream
// (kind=tar, the default; gzip allowed) or an OCI layout / docker save
// archive (kind=oci). The build runs while the upload streams in.
func (s *Server) importLayer(w http.ResponseWriter, r *http.Request, _ string) {
	q := r.URL.Query()
	if r.ContentLength > s.opt.MaxLayerBytes {
		s.writeError(w, r, errdefs.New(errdefs.TooLarge, wire.CodeLayerTooLarge, "layer uploads are limited to %d bytes", s.opt.MaxLayerBytes))
		return
	}
	body := http.MaxBytesReader(w, r.Body, s.opt.MaxLayerBytes)
	rec, err := s.opt.Images.Import(r.Context(), q.Get("kind"), body, q.Get("name"))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = errdefs.New(errdefs.TooLarge, wire.CodeLayerTooLarge, "layer uploads are limited to %d bytes", s.opt.MaxLayerBytes)
		}
		s.writeError(w, r, err)
		return
	}
	names, _ := s.opt.Images.LayerNames(r.Context(), rec.ID)
	writeJSON(w, http.StatusCreated, image.LayerToAPI(rec, names))
}

// buildDirLayer builds a layer from a directory on the server.
func (s *Server) buildDirLayer(w http.ResponseWriter, r *http.Request, _ string) {
	if !s.opt.AllowDirImages {
		s.writeError(w, r, errdefs.New(errdefs.PermissionDenied, wire.CodeDirImagesDisabled, "directory images and layers are disabled on this server"))
		return
	}
	var req wire.BuildDirLayerRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	rec, err := s.opt.Images.BuildDir(r.Context(), req.Path, req.Name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	names, _ := s.opt.Images.LayerNames(r.Context(), rec.ID)
	writeJSON(w, http.StatusCreated, image.LayerToAPI(rec, names))
}

func (s *Server) deleteLayer(w http.ResponseWriter, r *http.Request, _ string) {
	if err := s.opt.Images.RemoveLayer(r.Context(), r.PathValue("ref"), s.mgr.LayerInUse); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
