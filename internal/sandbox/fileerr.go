package sandbox

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"syscall"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// The files API's error codes, the same on every tier; api.ErrorCodes
// gives each its class and meaning.
const (
	CodeInvalidPath        = api.CodeInvalidPath          // empty, too long, NUL byte
	CodePathOutsideRoot    = api.CodePathOutsideRoot      // "..", or a symlink leading out
	CodePathIsRoot         = api.CodePathIsRoot           // removing or replacing the file root
	CodeFileNotFound       = api.CodeFileNotFound         // ENOENT
	CodeParentNotFound     = api.CodeParentNotFound       // a write's directory is missing
	CodeParentNotDirectory = api.CodeParentNotDirectory   // ENOTDIR: a file where a directory should be
	CodeNotADirectory      = api.CodeNotADirectory        // listing a file
	CodeIsADirectory       = api.CodeIsADirectory         // EISDIR: reading or writing a directory
	CodeNotAFile           = api.CodeNotAFile             // a FIFO, socket or device; ENXIO, ENODEV
	CodeNameTooLong        = api.CodeNameTooLong          // ENAMETOOLONG
	CodeSymlinkLoop        = api.CodeSymlinkLoop          // ELOOP
	CodeFileExists         = api.CodeFileExists           // EEXIST
	CodeDirectoryNotEmpty  = api.CodeDirectoryNotEmpty    // ENOTEMPTY
	CodeInvalidOperation   = api.CodeInvalidFileOperation // EINVAL, e.g. a directory moved into itself
	CodeCrossDevice        = api.CodeCrossDevice          // EXDEV: a rename across file systems
	CodeFileBusy           = api.CodeFileBusy             // EBUSY, ETXTBSY
	CodeWorkspaceFull      = api.CodeWorkspaceFull        // ENOSPC, EDQUOT
	CodeFileTooLarge       = api.CodeFileTooLarge         // EFBIG, or past WriteOptions.MaxBytes
	CodeTooManyEntries     = api.CodeTooManyEntries       // a listing past MaxListEntries
	CodeReadOnly           = api.CodeReadOnly             // EROFS: a read-only file system
	CodeReadOnlyPath       = api.CodeReadOnlyPath         // a path the phase does not let be written
	CodePermissionDenied   = api.CodePermissionDenied     // EACCES, EPERM
	CodeTooManyOpenFiles   = api.CodeTooManyOpenFiles     // EMFILE, ENFILE
	CodeFileIOError        = api.CodeFileIOError          // EIO, and any errno not listed here
	CodeCanceled           = api.CodeCanceled             // the request or the sandbox ended
)

// MaxListEntries bounds the entries of one listing on every tier.
const MaxListEntries = 1 << 16

// FileErrno is how the files API reports one errno.
type FileErrno struct {
	Errno syscall.Errno
	Class errdefs.Class
	Code  string
	// Format is the message; its one %s is the file's path.
	Format string
}

// FileErrnos maps the errors of file system calls to the files API's
// classes and codes. It is the only such map: every tier's files API
// classifies through FileError.
var FileErrnos = []FileErrno{
	{syscall.ENOENT, errdefs.NotFound, CodeFileNotFound, "%s does not exist"},
	{syscall.ENOTDIR, errdefs.NotFound, CodeParentNotDirectory, "%s does not exist: a file stands where its path needs a directory"},
	{syscall.EISDIR, errdefs.Invalid, CodeIsADirectory, "%s is a directory"},
	{syscall.ENXIO, errdefs.Invalid, CodeNotAFile, "%s is not a regular file"},
	{syscall.ENODEV, errdefs.Invalid, CodeNotAFile, "%s is not a regular file"},
	{syscall.ENAMETOOLONG, errdefs.Invalid, CodeNameTooLong, "%s: a name in the path is longer than 255 bytes"},
	{syscall.ELOOP, errdefs.Invalid, CodeSymlinkLoop, "%s: too many symbolic links on the path"},
	{syscall.EINVAL, errdefs.Invalid, CodeInvalidOperation, "%s: the operation is not valid there (e.g. a directory moved into itself)"},
	{syscall.EXDEV, errdefs.Invalid, CodeCrossDevice, "%s: cannot be moved across file systems"},
	{syscall.EEXIST, errdefs.Conflict, CodeFileExists, "%s already exists"},
	{syscall.ENOTEMPTY, errdefs.Conflict, CodeDirectoryNotEmpty, "%s is a directory that is not empty"},
	{syscall.EBUSY, errdefs.Conflict, CodeFileBusy, "%s is busy (a mount point, or in use)"},
	{syscall.ETXTBSY, errdefs.Conflict, CodeFileBusy, "%s is busy (a mount point, or in use)"},
	{syscall.ENOSPC, errdefs.TooLarge, CodeWorkspaceFull, "no space left for %s: the sandbox's disk is full"},
	{syscall.EDQUOT, errdefs.TooLarge, CodeWorkspaceFull, "no space left for %s: the sandbox's disk is full"},
	{syscall.EFBIG, errdefs.TooLarge, CodeFileTooLarge, "%s would be larger than its file system allows"},
	{syscall.EROFS, errdefs.PermissionDenied, CodeReadOnly, "%s is on a read-only file system"},
	{syscall.EACCES, errdefs.PermissionDenied, CodePermissionDenied, "permission denied on %s"},
	{syscall.EPERM, errdefs.PermissionDenied, CodePermissionDenied, "permission denied on %s"},
	{syscall.EMFILE, errdefs.Unavailable, CodeTooManyOpenFiles, "%s: the sandbox has too many open files; try again"},
	{syscall.ENFILE, errdefs.Unavailable, CodeTooManyOpenFiles, "%s: the sandbox has too many open files; try again"},
	{syscall.EIO, errdefs.Internal, CodeFileIOError, "%s: input/output error"},
}

// FileError classifies err, from an operation of the files API on the
// file users see at abs. It is the one map from the errors of file system
// calls to the API's classes and codes, which every tier's files API (the
// in-sandbox agent's, the function tier's) classifies through:
//   - an already classified error is kept;
//   - the request's end (context.Canceled, DeadlineExceeded) is
//     Unavailable, canceled;
//   - a closed root or file (os.ErrClosed: the sandbox ended under the
//     operation) is NotFound, sandbox_not_found;
//   - an errno gets its FileErrnos entry (an errno not listed there is
//     Internal, file_io_error, with the errno's text);
//   - os.Root's refusal of a path that leads out of the root is Invalid,
//     path_outside_root.
func FileError(abs string, err error) error {
	var de *errdefs.Error
	var errno syscall.Errno
	switch {
	case err == nil:
		return nil
	case errors.As(err, &de):
		return err
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return errdefs.Wrap(errdefs.Unavailable, CodeCanceled, err, "the operation on %s was cancelled", abs)
	case errors.Is(err, os.ErrClosed):
		return errdefs.Wrap(errdefs.NotFound, api.CodeSandboxNotFound, err, "the sandbox is gone")
	case errors.As(err, &errno):
		for _, e := range FileErrnos {
			if e.Errno == errno {
				return errdefs.Wrap(e.Class, e.Code, err, e.Format, abs)
			}
		}
		return errdefs.Wrap(errdefs.Internal, CodeFileIOError, err, "%s: %s", abs, errno.Error())
	}
	var pe *fs.PathError
	var le *os.LinkError
	if errors.As(err, &pe) || errors.As(err, &le) {
		// A path error without an errno is os.Root's own: a path (".."
		// or a symlink) that leads out of the root.
		return errdefs.Wrap(errdefs.Invalid, CodePathOutsideRoot, err, "%s leads outside the sandbox's file root", abs)
	}
	return errdefs.Wrap(errdefs.Internal, CodeFileIOError, err, "the operation on %s failed", abs)
}

// errNotRegular is the files API's refusal to read a file that is not
// regular.
func errNotRegular(abs string, mode fs.FileMode) error {
	if mode.IsDir() {
		return errdefs.New(errdefs.Invalid, CodeIsADirectory, "%s is a directory", abs)
	}
	what := "not a regular file"
	switch mode.Type() {
	case fs.ModeNamedPipe:
		what = "a FIFO"
	case fs.ModeSocket:
		what = "a socket"
	case fs.ModeDevice, fs.ModeDevice | fs.ModeCharDevice:
		what = "a device"
	case fs.ModeSymlink:
		what = "a symbolic link"
	}
	return errdefs.New(errdefs.Invalid, CodeNotAFile, "%s is %s; only regular files can be read", abs, what)
}

// OpenRegular opens rel in root, the file users see at abs, for reading
// if it is a regular file, and refuses anything else (a directory, FIFO,
// socket or device) before opening it: opening a FIFO waits for a writer,
// a device may do anything. The open itself is non-blocking and checked
// again, so a file swapped for a FIFO in between is refused too. Errors
// are classified (FileError).
func OpenRegular(root *os.Root, abs, rel string) (*os.File, fs.FileInfo, error) {
	fi, err := root.Stat(rel)
	if err != nil {
		return nil, nil, FileError(abs, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, errNotRegular(abs, fi.Mode())
	}
	fh, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, FileError(abs, err)
	}
	if fi, err = fh.Stat(); err != nil {
		fh.Close()
		return nil, nil, FileError(abs, err)
	}
	if !fi.Mode().IsRegular() {
		fh.Close()
		return nil, nil, errNotRegular(abs, fi.Mode())
	}
	return fh, fi, nil
}
