package httpapi

import (
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"

	wire "github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// statusOf maps an error class to its HTTP status. This is the only place
// the mapping exists.
func statusOf(c errdefs.Class) int {
	switch c {
	case errdefs.Invalid:
		return http.StatusBadRequest
	case errdefs.Unauthenticated:
		return http.StatusUnauthorized
	case errdefs.PermissionDenied:
		return http.StatusForbidden
	case errdefs.NotFound:
		return http.StatusNotFound
	case errdefs.Conflict:
		return http.StatusConflict
	case errdefs.TooLarge:
		return http.StatusRequestEntityTooLarge
	case errdefs.Unsupported:
		return http.StatusUnprocessableEntity
	case errdefs.RateLimited:
		return http.StatusTooManyRequests
	case errdefs.Unavailable:
		return http.StatusServiceUnavailable
	case errdefs.DeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// wireError is the JSON body of an error.
func wireError(err error) (int, wire.Error) {
	class := errdefs.ClassOf(err)
	return statusOf(class), wire.Error{Code: errdefs.CodeOf(err), Message: errdefs.MessageOf(err), Class: string(class)}
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, body := wireError(err)
	if status >= 500 {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "code", body.Code, "err", err,
			"request_id", w.Header().Get("X-Request-Id"))
	}
	if d := errdefs.RetryAfterOf(err); d > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.Seconds()))))
	}
	s.opt.Metrics.Error(body.Code)
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"code":"internal","message":"encoding response","class":"internal"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// decode reads one JSON object into v, strictly: unknown fields, trailing
// data and bodies over the limit are errors.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return errdefs.New(errdefs.Invalid, wire.CodeUnsupportedContentType, "content type must be application/json, not %q", ct)
	}
	body := http.MaxBytesReader(w, r.Body, s.opt.MaxBodyBytes)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err, s.opt.MaxBodyBytes)
	}
	if _, err := dec.Token(); err != io.EOF {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return decodeError(err, s.opt.MaxBodyBytes)
		}
		return errdefs.New(errdefs.Invalid, wire.CodeInvalidJSON, "request body has data after the JSON object")
	}
	return nil
}

func decodeError(err error, limit int64) error {
	var mbe *http.MaxBytesError
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &mbe):
		return errdefs.New(errdefs.TooLarge, wire.CodeBodyTooLarge, "request body is larger than %d bytes", limit)
	case errors.Is(err, io.EOF):
		return errdefs.New(errdefs.Invalid, wire.CodeEmptyBody, "request body is empty; a JSON object is required")
	case errors.As(err, &syn), errors.Is(err, io.ErrUnexpectedEOF):
		return errdefs.New(errdefs.Invalid, wire.CodeInvalidJSON, "request body is not valid JSON: %v", err)
	case errors.As(err, &typ):
		return errdefs.New(errdefs.Invalid, wire.CodeInvalidField, "field %q must be %s", typ.Field, typ.Type)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return errdefs.New(errdefs.Invalid, wire.CodeUnknownField, "%s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return errdefs.New(errdefs.Invalid, wire.CodeInvalidJSON, "request body is not valid JSON: %v", err)
}
