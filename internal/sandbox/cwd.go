package sandbox

import (
	"errors"
	"io/fs"
	"syscall"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// The error codes of a command's working directory, the same on every
// tier; api.ErrorCodes gives each its class and meaning.
const (
	CodeInvalidCwd      = api.CodeInvalidCwd       // a NUL byte, "..", or a directory that cannot be used
	CodeCwdNotFound     = api.CodeCwdNotFound      // ENOENT, ENOTDIR
	CodeCwdNotDirectory = api.CodeCwdNotADirectory // a file, not a directory
)

// CwdError is the error of a command whose working directory dir (a
// clean absolute path) stats as fi, err: nil for a directory. Tiers check
// the directory before anything runs, so that a missing one fails the
// request the same way everywhere instead of, on some, running the
// command elsewhere.
func CwdError(dir string, fi fs.FileInfo, err error) error {
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return errdefs.New(errdefs.Invalid, CodeCwdNotDirectory, "working directory %s is not a directory", dir)
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return errdefs.Wrap(errdefs.NotFound, CodeCwdNotFound, err, "working directory %s does not exist", dir)
	}
	return errdefs.Wrap(errdefs.Invalid, CodeInvalidCwd, err, "working directory %s is not usable", dir)
}
