package client

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dsec-dev/dsec/api"
)

// Error classes, as sent in the "class" field of error bodies.
const (
	ClassInvalid          = api.ClassInvalid
	ClassUnauthenticated  = api.ClassUnauthenticated
	ClassPermissionDenied = api.ClassPermissionDenied
	ClassNotFound         = api.ClassNotFound
	ClassConflict         = api.ClassConflict
	ClassTooLarge         = api.ClassTooLarge
	ClassUnsupported      = api.ClassUnsupported
	ClassRateLimited      = api.ClassRateLimited
	ClassUnavailable      = api.ClassUnavailable
	ClassDeadlineExceeded = api.ClassDeadlineExceeded
	ClassInternal         = api.ClassInternal
)

// Sentinels matched by errors.Is against an *Error of the same class.
var (
	ErrInvalid          = errors.New(ClassInvalid)
	ErrUnauthenticated  = errors.New(ClassUnauthenticated)
	ErrPermissionDenied = errors.New(ClassPermissionDenied)
	ErrNotFound         = errors.New(ClassNotFound)
	ErrConflict         = errors.New(ClassConflict)
	ErrTooLarge         = errors.New(ClassTooLarge)
	ErrUnsupported      = errors.New(ClassUnsupported)
	ErrRateLimited      = errors.New(ClassRateLimited)
	ErrUnavailable      = errors.New(ClassUnavailable)
	ErrDeadlineExceeded = errors.New(ClassDeadlineExceeded)
	ErrInternal         = errors.New(ClassInternal)
)

// Error is an error reported by the server: a non-2xx response, or an error
// event ending a command stream (StatusCode 0).
type Error struct {
	StatusCode int
	// Code is stable and names the condition: one of api.ErrorCodes,
	// e.g. api.CodeSandboxNotFound, or the class's name.
	Code    string
	Message string
	// Class is the error class; when the body did not name one it is
	// inferred from StatusCode.
	Class string
	// RetryAfter is the server's Retry-After hint, or 0.
	RetryAfter time.Duration
}

// Error returns "message (code)".
func (e *Error) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.StatusCode)
	}
	if e.Code != "" {
		return msg + " (" + e.Code + ")"
	}
	if e.StatusCode != 0 {
		return msg + " (HTTP " + strconv.Itoa(e.StatusCode) + ")"
	}
	return msg
}

// Is reports whether target is the sentinel of e's class.
func (e *Error) Is(target error) bool {
	s, ok := sentinels[e.Class]
	return ok && s == target
}

var sentinels = map[string]error{
	ClassInvalid:          ErrInvalid,
	ClassUnauthenticated:  ErrUnauthenticated,
	ClassPermissionDenied: ErrPermissionDenied,
	ClassNotFound:         ErrNotFound,
	ClassConflict:         ErrConflict,
	ClassTooLarge:         ErrTooLarge,
	ClassUnsupported:      ErrUnsupported,
	ClassRateLimited:      ErrRateLimited,
	ClassUnavailable:      ErrUnavailable,
	ClassDeadlineExceeded: ErrDeadlineExceeded,
	ClassInternal:         ErrInternal,
}

// IsNotFound reports whether err is a not_found error.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsConflict reports whether err is a conflict error.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// IsRateLimited reports whether err is a rate_limited error.
func IsRateLimited(err error) bool { return errors.Is(err, ErrRateLimited) }

// IsUnsupported reports whether err is an unsupported error.
func IsUnsupported(err error) bool { return errors.Is(err, ErrUnsupported) }

// IsInvalid reports whether err is an invalid_argument error.
func IsInvalid(err error) bool { return errors.Is(err, ErrInvalid) }

// IsUnauthenticated reports whether err is an unauthenticated error.
func IsUnauthenticated(err error) bool { return errors.Is(err, ErrUnauthenticated) }

// classOfStatus infers a class when the body named none.
func classOfStatus(code int) string {
	switch code {
	case http.StatusBadRequest:
		return ClassInvalid
	case http.StatusUnauthorized:
		return ClassUnauthenticated
	case http.StatusForbidden:
		return ClassPermissionDenied
	case http.StatusNotFound:
		return ClassNotFound
	case http.StatusConflict:
		return ClassConflict
	case http.StatusRequestEntityTooLarge:
		return ClassTooLarge
	case http.StatusUnprocessableEntity, http.StatusNotImplemented:
		return ClassUnsupported
	case http.StatusTooManyRequests:
		return ClassRateLimited
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		return ClassUnavailable
	case http.StatusGatewayTimeout:
		return ClassDeadlineExceeded
	}
	return ClassInternal
}

// maxErrorBody caps how much of an error body is read.
const maxErrorBody = 64 << 10

// newError builds the *Error of a non-2xx response from its status, headers
// and (the start of) its body. Bodies that are not a JSON error object keep
// their text, trimmed, as the message.
func newError(status int, h http.Header, body []byte) *Error {
	e := &Error{StatusCode: status, RetryAfter: parseRetryAfter(h.Get("Retry-After"), time.Now())}
	var ae api.Error
	if json.Unmarshal(body, &ae) == nil && (ae.Code != "" || ae.Message != "") {
		e.Code, e.Message, e.Class = ae.Code, ae.Message, ae.Class
	} else {
		e.Message = plainMessage(body)
	}
	if e.Class == "" {
		e.Class = classOfStatus(status)
	}
	return e
}

// eventError turns the error of a stream's error event into an *Error.
func eventError(ae *api.Error) *Error {
	if ae == nil {
		return &Error{Code: "stream_error", Message: "command stream ended with an error", Class: ClassInternal}
	}
	e := &Error{Code: ae.Code, Message: ae.Message, Class: ae.Class}
	if e.Class == "" {
		e.Class = ClassInternal
	}
	return e
}

// plainMessage makes a short, printable message of a non-JSON body.
func plainMessage(body []byte) string {
	const max = 512
	s := strings.TrimSpace(string(body))
	if len(s) > max {
		s = s[:max]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += "…"
	}
	return s
}

// parseRetryAfter parses a Retry-After value: seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 32); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}
