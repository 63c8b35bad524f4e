// Package errdefs defines DSec's error classes. Every error that reaches a
// user carries one class (which the REST edge maps to an HTTP status, once)
// and a stable code naming the precise condition: a constant of the api
// package's registry (api.ErrorCodes), which gives each code its class; a
// test fails on a code written as a string or used with another class.
// The message is written for the user; the cause, if any, is kept apart
// for logs.
package errdefs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/dsec-dev/dsec/api"
)

// Class is an error class. Classes are errors themselves, so
// errors.Is(err, errdefs.NotFound) works on any error of that class.
type Class string

func (c Class) Error() string { return string(c) }

// The classes. Their string values are part of the wire protocol, to
// users and between server and nodes: the api package names them.
const (
	Invalid          Class = api.ClassInvalid
	Unauthenticated  Class = api.ClassUnauthenticated
	PermissionDenied Class = api.ClassPermissionDenied
	NotFound         Class = api.ClassNotFound
	Conflict         Class = api.ClassConflict
	TooLarge         Class = api.ClassTooLarge
	Unsupported      Class = api.ClassUnsupported
	RateLimited      Class = api.ClassRateLimited
	Unavailable      Class = api.ClassUnavailable
	DeadlineExceeded Class = api.ClassDeadlineExceeded
	Internal         Class = api.ClassInternal
)

// Classes lists every class, for tests and documentation.
var Classes = []Class{Invalid, Unauthenticated, PermissionDenied, NotFound, Conflict,
	TooLarge, Unsupported, RateLimited, Unavailable, DeadlineExceeded, Internal}

// ParseClass returns the class named s, or Internal if s names none.
func ParseClass(s string) Class {
	for _, c := range Classes {
		if string(c) == s {
			return c
		}
	}
	return Internal
}

// ErrNotSupported is wrapped by host feature probes that fail because the
// machine lacks the feature (a kernel option, a device, a tool).
var ErrNotSupported = errors.New("not supported on this host")

// Error is a classified error with a stable code and a user-facing message.
type Error struct {
	Class Class
	// Code names the condition precisely: one of api.ErrorCodes, used
	// with its class, e.g. api.CodeSandboxNotFound.
	Code string
	// Msg is safe to show to the user.
	Msg string
	// Cause is for logs; it is not shown to the user.
	Cause error
	// RetryAfter hints when a RateLimited or Unavailable request may succeed.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Cause != nil {
		return e.Msg + ": " + e.Cause.Error()
	}
	return e.Msg
}

// Is makes errors.Is(err, class) true for the error's class.
func (e *Error) Is(target error) bool {
	c, ok := target.(Class)
	return ok && c == e.Class
}

func (e *Error) Unwrap() error { return e.Cause }

// New returns an error of class c with code and a formatted message.
func New(c Class, code, format string, args ...any) *Error {
	return &Error{Class: c, Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Wrap returns an error of class c whose cause is err.
func Wrap(c Class, code string, err error, format string, args ...any) *Error {
	return &Error{Class: c, Code: code, Msg: fmt.Sprintf(format, args...), Cause: err}
}

// Within returns an error of class c and code for err, a failure found
// within the formatted context (e.g. "phase work"). If err is classified,
// its message (written for the user) follows the context's, so that the
// reason reaches the user: "phase work: executable "/x": …". Otherwise err
// is the hidden cause, as with Wrap.
func Within(c Class, code string, err error, format string, args ...any) *Error {
	msg := fmt.Sprintf(format, args...)
	var e *Error
	if errors.As(err, &e) {
		return &Error{Class: c, Code: code, Msg: msg + ": " + e.Msg}
	}
	return &Error{Class: c, Code: code, Msg: msg, Cause: err}
}

// ClassOf returns the class of err: its own if it is classified, otherwise
// one inferred from well-known standard errors, otherwise Internal.
func ClassOf(err error) Class {
	var e *Error
	var c Class
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Class
	case errors.As(err, &c):
		return c
	case errors.Is(err, fs.ErrNotExist):
		return NotFound
	case errors.Is(err, fs.ErrExist):
		return Conflict
	case errors.Is(err, fs.ErrPermission):
		return PermissionDenied
	case errors.Is(err, context.DeadlineExceeded):
		return DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return Unavailable
	case errors.Is(err, ErrNotSupported):
		return Unsupported
	}
	return Internal
}

// CodeOf returns err's code, or the name of its class if it has none.
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) && e.Code != "" {
		return e.Code
	}
	return string(ClassOf(err))
}

// MessageOf returns the user-facing message of err. Unclassified errors
// keep their text unless they are Internal, whose detail stays in logs.
func MessageOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Msg
	}
	if ClassOf(err) == Internal {
		return "internal error"
	}
	return err.Error()
}

// RetryAfterOf returns err's retry hint, or 0.
func RetryAfterOf(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}
