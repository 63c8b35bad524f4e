package httpapi

import (
	"net/http"
	"strconv"

	wire "github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

func pid(r *http.Request) (int, error) {
	p, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || p <= 0 {
		return 0, errdefs.New(errdefs.Invalid, wire.CodeInvalidPid, "pid must be a positive integer")
	}
	return p, nil
}

func (s *Server) startProcess(w http.ResponseWriter, r *http.Request, owner string) {
	var req wire.ExecRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := s.mgr.StartProcess(r.Context(), owner, r.PathValue("id"), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, p)
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request, owner string) {
	ps, err := s.mgr.ListProcesses(r.Context(), owner, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if ps == nil {
		ps = []wire.Process{}
	}
	writeJSON(w, http.StatusOK, wire.ProcessList{Processes: ps})
}

func (s *Server) getProcess(w http.ResponseWriter, r *http.Request, owner string) {
	n, err := pid(r)
	if err == nil {
		var p wire.Process
		if p, err = s.mgr.GetProcess(r.Context(), owner, r.PathValue("id"), n); err == nil {
			writeJSON(w, http.StatusOK, p)
			return
		}
	}
	s.writeError(w, r, err)
}

func (s *Server) waitProcess(w http.ResponseWriter, r *http.Request, owner string) {
	n, err := pid(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var waitS float64
	if v := r.URL.Query().Get("timeout_s"); v != "" {
		if waitS, err = strconv.ParseFloat(v, 64); err != nil || waitS < 0 {
			s.writeError(w, r, errdefs.New(errdefs.Invalid, wire.CodeInvalidQuery, "timeout_s must be a non-negative number"))
			return
		}
	}
	res, err := s.mgr.WaitProcess(r.Context(), owner, r.PathValue("id"), n, waitS)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) sendStdin(w http.ResponseWriter, r *http.Request, owner string) {
	n, err := pid(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req wire.StdinRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.mgr.SendStdin(r.Context(), owner, r.PathValue("id"), n, []byte(req.Data)); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) closeStdin(w http.ResponseWriter, r *http.Request, owner string) {
	n, err := pid(r)
	if err == nil {
		err = s.mgr.CloseStdin(r.Context(), owner, r.PathValue("id"), n)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) killProcess(w http.ResponseWriter, r *http.Request, owner string) {
	n, err := pid(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req wire.SignalRequest
	if r.ContentLength != 0 {
		if err := s.decode(w, r, &req); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	if err := s.mgr.Signal(r.Context(), owner, r.PathValue("id"), n, req.Signal); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
