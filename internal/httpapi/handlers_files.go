package httpapi

import (
	"errors"
	"io"
	"net/http"
	"strconv"

	wire "github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

func pathParam(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		return "", errdefs.New(errdefs.Invalid, wire.CodeInvalidPath, "the path query parameter is required")
	}
	return p, nil
}

func boolParam(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.New(errdefs.Invalid, wire.CodeInvalidQuery, "%s must be true or false", name)
	}
	return b, nil
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request, owner string) {
	p, err := pathParam(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rc, info, err := s.mgr.OpenFile(r.Context(), owner, r.PathValue("id"), p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	// The size at open time: a file growing meanwhile is cut there, so the
	// length we announce is the length we send.
	w.Header().Set("Content-Length", strconv.FormatInt(info.Size, 10))
	w.Header().Set("Last-Modified", info.ModTime.UTC().Format(http.TimeFormat))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, io.LimitReader(rc, info.Size)); err != nil {
		s.log.Debug("download ended early", "path", p, "err", err)
	}
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request, owner string) {
	p, err := pathParam(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var mode uint64
	if v := r.URL.Query().Get("mode"); v != "" {
		if mode, err = strconv.ParseUint(v, 8, 32); err != nil || mode > 0o7777 {
			s.writeError(w, r, errdefs.New(errdefs.Invalid, wire.CodeInvalidMode, "mode must be octal permission bits such as 0644"))
			return
		}
	}
	parents, err := boolParam(r, "parents")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if r.ContentLength > s.opt.MaxFileBytes {
		s.writeError(w, r, errdefs.New(errdefs.TooLarge, wire.CodeFileTooLarge, "files are limited to %d bytes", s.opt.MaxFileBytes))
		return
	}
	body := http.MaxBytesReader(w, r.Body, s.opt.MaxFileBytes)
	info, err := s.mgr.WriteFile(r.Context(), owner, r.PathValue("id"), p, body, uint32(mode), parents)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = errdefs.New(errdefs.TooLarge, wire.CodeFileTooLarge, "files are limited to %d bytes", s.opt.MaxFileBytes)
		}
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request, owner string) {
	p, err := pathParam(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	recursive, err := boolParam(r, "recursive")
	if err == nil {
		err = s.mgr.RemoveFile(r.Context(), owner, r.PathValue("id"), p, recursive)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request, owner string) {
	p, err := pathParam(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	depth := 1
	if v := r.URL.Query().Get("depth"); v != "" {
		if depth, err = strconv.Atoi(v); err != nil || depth < 1 || depth > 32 {
			s.writeError(w, r, errdefs.New(errdefs.Invalid, wire.CodeInvalidQuery, "depth must be between 1 and 32"))
			return
		}
	}
	entries, err := s.mgr.ListFiles(r.Context(), owner, r.PathValue("id"), p, depth)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.FileList{Entries: entries})
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request, owner string) {
	p, err := pathParam(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	info, err := s.mgr.StatFile(r.Context(), owner, r.PathValue("id"), p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (s *Server) existsFile(w http.ResponseWriter, r *http.Request, owner string) {
	p, err := pathParam(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	_, err = s.mgr.StatFile(r.Context(), owner, r.PathValue("id"), p)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, wire.ExistsResponse{Exists: true})
	case errdefs.ClassOf(err) == errdefs.NotFound && errdefs.CodeOf(err) != wire.CodeSandboxNotFound:
		writeJSON(w, http.StatusOK, wire.ExistsResponse{Exists: false})
	default:
		s.writeError(w, r, err)
	}
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request, owner string) {
	var req wire.MkdirRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	info, err := s.mgr.Mkdir(r.Context(), owner, r.PathValue("id"), req.Path, req.Parents)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, info)
}

func (s *Server) rename(w http.ResponseWriter, r *http.Request, owner string) {
	var req wire.RenameRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	info, err := s.mgr.Rename(r.Context(), owner, r.PathValue("id"), req.From, req.To)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}
