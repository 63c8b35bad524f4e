package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	wire "github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/controlplane"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request, owner string) {
	var req wire.CreateSandboxRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.RequestID == "" {
		req.RequestID = r.Header.Get(wire.IdempotencyKeyHeader)
	}
	sb, err := s.mgr.Create(r.Context(), owner, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, sb)
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request, owner string) {
	q := r.URL.Query()
	o := controlplane.ListOptions{State: wire.State(q.Get("state")), Tier: q.Get("tier"), PageToken: q.Get("page_token")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			s.writeError(w, r, errdefs.New(errdefs.Invalid, wire.CodeInvalidQuery, "limit must be an integer"))
			return
		}
		o.Limit = n
	}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			s.writeError(w, r, errdefs.New(errdefs.Invalid, wire.CodeInvalidQuery, "label filters are key=value, got %q", l))
			return
		}
		if o.Labels == nil {
			o.Labels = map[string]string{}
		}
		o.Labels[k] = v
	}
	list, err := s.mgr.List(owner, o)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request, owner string) {
	sb, err := s.mgr.Get(owner, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

func (s *Server) sandboxStats(w http.ResponseWriter, r *http.Request, owner string) {
	st, err := s.mgr.Stats(r.Context(), owner, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request, owner string) {
	if err := s.mgr.Delete(r.Context(), owner, r.PathValue("id"), "deleted"); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) integrity(w http.ResponseWriter, r *http.Request, owner string) {
	rep, err := s.mgr.Integrity(r.Context(), owner, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

func (s *Server) auditEvents(w http.ResponseWriter, r *http.Request, owner string) {
	q := r.URL.Query()
	num := func(name string) (int, error) {
		v := q.Get(name)
		if v == "" {
			return 0, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return 0, errdefs.New(errdefs.Invalid, wire.CodeBadRequest, "%s must be a whole number", name)
		}
		return n, nil
	}
	skip, err := num("skip")
	limit, err2 := num("limit")
	if err == nil {
		err = err2
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	evs, err := s.mgr.AuditEvents(r.Context(), owner, r.PathValue("id"), skip, limit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.AuditEventList{Events: evs})
}

// auditEventsStream sends a sandbox's audit events as NDJSON, one
// AuditEvent a line, the stored ones first, then each new one as the
// monitor sees it, until the client goes or the sandbox has ended.
func (s *Server) auditEventsStream(w http.ResponseWriter, r *http.Request, owner string) {
	skip := 0
	if v := r.URL.Query().Get("skip"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			s.writeError(w, r, errdefs.New(errdefs.Invalid, wire.CodeBadRequest, "skip must be a whole number ≥ 0"))
			return
		}
		skip = n
	}
	id := r.PathValue("id")
	if _, err := s.mgr.Get(owner, id); err != nil {
		s.writeError(w, r, err)
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	enc := json.NewEncoder(w)
	err := s.mgr.FollowAuditEvents(r.Context(), owner, id, skip, func(e wire.AuditEvent) error {
		if err := enc.Encode(e); err != nil {
			return err
		}
		return rc.Flush()
	})
	if err != nil && r.Context().Err() == nil {
		s.log.Warn("streaming audit events", "sandbox", id, "err", err)
	}
}

func (s *Server) setPhase(w http.ResponseWriter, r *http.Request, owner string) {
	var req wire.SetPhaseRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.mgr.SetPhase(r.Context(), owner, r.PathValue("id"), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

// grade runs a sealed grading; it takes as long as the grader does.
func (s *Server) grade(w http.ResponseWriter, r *http.Request, owner string) {
	var req wire.GradeRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.mgr.Grade(r.Context(), owner, r.PathValue("id"), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, owner string) {
	var req wire.SetTimeoutRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.mgr.SetTimeout(r.Context(), owner, r.PathValue("id"), req.TimeoutS)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}
