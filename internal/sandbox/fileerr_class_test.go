package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// TestFileErrorClasses: the cases of the one errno and file-error map
// beside the errno table (TestFileErrnosAll): what the agent's and the
// function tier's copies of it each handled, and now both do.
func TestFileErrorClasses(t *testing.T) {
	classified := errdefs.New(errdefs.TooLarge, CodeFileTooLarge, "too large")
	tests := []struct {
		name  string
		err   error
		class errdefs.Class
		code  string
	}{
		{"classified", classified, errdefs.TooLarge, CodeFileTooLarge},
		{"classified over a closed file", errdefs.Wrap(errdefs.Conflict, CodeFileBusy, os.ErrClosed, "busy"), errdefs.Conflict, CodeFileBusy},
		{"canceled", context.Canceled, errdefs.Unavailable, CodeCanceled},
		{"deadline", fmt.Errorf("reading: %w", context.DeadlineExceeded), errdefs.Unavailable, CodeCanceled},
		{"closed", os.ErrClosed, errdefs.NotFound, "sandbox_not_found"},
		{"closed file", &fs.PathError{Op: "read", Path: "f", Err: os.ErrClosed}, errdefs.NotFound, "sandbox_not_found"},
		{"read-only", &fs.PathError{Op: "openat", Path: "f", Err: syscall.EROFS}, errdefs.PermissionDenied, CodeReadOnly},
		{"bare errno", syscall.ENOSPC, errdefs.TooLarge, CodeWorkspaceFull},
		{"unlisted errno", &fs.PathError{Op: "x", Path: "f", Err: syscall.ENOLINK}, errdefs.Internal, CodeFileIOError},
		{"os.Root escape", &fs.PathError{Op: "openat", Path: "../x", Err: errors.New("path escapes from parent")}, errdefs.Invalid, CodePathOutsideRoot},
		{"rename escape", &os.LinkError{Op: "renameat", Old: "a", New: "../b", Err: errors.New("path escapes from parent")}, errdefs.Invalid, CodePathOutsideRoot},
		{"other", errors.New("short write"), errdefs.Internal, CodeFileIOError},
	}
	for _, tt := range tests {
		got := FileError("/p", tt.err)
		if errdefs.ClassOf(got) != tt.class || errdefs.CodeOf(got) != tt.code {
			t.Errorf("%s: %v → %s %s, want %s %s", tt.name, tt.err, errdefs.ClassOf(got), errdefs.CodeOf(got), tt.class, tt.code)
		}
		if !errors.Is(got, tt.err) {
			t.Errorf("%s: %v does not wrap %v", tt.name, got, tt.err)
		}
	}
	if err := FileError("/p", nil); err != nil {
		t.Errorf("nil: %v", err)
	}
	if got := FileError("/p", classified); got != error(classified) {
		t.Errorf("a classified error changed: %v", got)
	}
}
