package httpapi

import (
	"io"
	"net/http"
	"strconv"

	wire "github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Trajectories, snapshots and forks (docs/design/trajectories.md). A
// trajectory's ID may hold "/": clients send it percent-encoded as one
// path segment, which the mux matches escaped and hands over decoded.

func (s *Server) snapshotSandbox(w http.ResponseWriter, r *http.Request, owner string) {
	snap, err := s.mgr.Snapshot(r.Context(), owner, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snap)
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request, owner string) {
	var req wire.ForkRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.mgr.Fork(r.Context(), owner, r.PathValue("id"), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, res)
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request, owner string) {
	snap, err := s.mgr.GetSnapshot(r.Context(), owner, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snap)
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request, owner string) {
	if err := s.mgr.DeleteSnapshot(r.Context(), owner, r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listTrajectories(w http.ResponseWriter, r *http.Request, owner string) {
	q := r.URL.Query()
	limit, err := queryInt(q.Get("limit"), "limit")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	list, err := s.mgr.ListTrajectories(r.Context(), owner, q.Get("page_token"), limit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) getTrajectory(w http.ResponseWriter, r *http.Request, owner string) {
	t, err := s.mgr.GetTrajectory(r.Context(), owner, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

func (s *Server) trajectorySteps(w http.ResponseWriter, r *http.Request, owner string) {
	q := r.URL.Query()
	after, err := queryInt(q.Get("after"), "after")
	if err == nil && q.Get("page_token") != "" {
		after, err = queryInt(q.Get("page_token"), "page_token")
	}
	limit, err2 := queryInt(q.Get("limit"), "limit")
	if err == nil {
		err = err2
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	page, err := s.mgr.TrajectorySteps(r.Context(), owner, r.PathValue("id"), after, limit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// exportTrajectory streams the whole log as JSON lines. Once the first
// line is out, a failure can only cut the stream short: the client sees
// an incomplete last line or fewer steps than the head's count.
func (s *Server) exportTrajectory(w http.ResponseWriter, r *http.Request, owner string) {
	id := r.PathValue("id")
	if _, err := s.mgr.GetTrajectory(r.Context(), owner, id); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	if err := s.mgr.ExportTrajectory(r.Context(), owner, id, w); err != nil {
		s.log.Warn("exporting a trajectory", "trajectory", id, "err", err)
	}
}

func (s *Server) trajectoryBlob(w http.ResponseWriter, r *http.Request, owner string) {
	rc, n, err := s.mgr.TrajectoryBlob(r.Context(), owner, r.PathValue("id"), r.PathValue("digest"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, io.LimitReader(rc, n))
}

func (s *Server) deleteTrajectory(w http.ResponseWriter, r *http.Request, owner string) {
	if err := s.mgr.DeleteTrajectory(r.Context(), owner, r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) resumeTrajectory(w http.ResponseWriter, r *http.Request, owner string) {
	var req wire.ResumeRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.mgr.Resume(r.Context(), owner, r.PathValue("id"), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, res)
}

// queryInt parses an optional whole-number query parameter (0 if absent).
func queryInt(v, name string) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, errdefs.New(errdefs.Invalid, wire.CodeInvalidQuery, "%s must be a whole number ≥ 0", name)
	}
	return n, nil
}
