package sandbox

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"syscall"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// The files API's error codes, the same on every tier. api/openapi.yaml
// lists each (components.x-error-codes) with its class; a test keeps the
// two in step.
const (
	CodeInvalidPath        = "invalid_path"           // empty, too long, NUL byte
	CodePathOutsideRoot    = "path_outside_root"      // "..", or a symlink leading out
	CodePathIsRoot         = "path_is_root"           // removing or replacing the file root
	CodeFileNotFound       = "file_not_found"         // ENOENT
	CodeParentNotFound     = "parent_not_found"       // a write's directory is missing
	CodeParentNotDirectory = "parent_not_directory"   // ENOTDIR: a file where a directory should be
	CodeNotADirectory      = "not_a_directory"        // listing a file
	CodeIsADirectory       = "is_a_directory"         // EISDIR: reading or writing a directory
	CodeNotAFile           = "not_a_file"             // a FIFO, socket or device; ENXIO, ENODEV
	CodeNameTooLong        = "name_too_long"          // ENAMETOOLONG
	CodeSymlinkLoop        = "symlink_loop"           // ELOOP
	CodeFileExists         = "file_exists"            // EEXIST
	CodeDirectoryNotEmpty  = "directory_not_empty"    // ENOTEMPTY
	CodeInvalidOperation   = "invalid_file_operation" // EINVAL, e.g. a directory moved into itself
	CodeCrossDevice        = "cross_device"           // EXDEV: a rename across file systems
	CodeFileBusy           = "file_busy"              // EBUSY, ETXTBSY
	CodeWorkspaceFull      = "workspace_full"         // ENOSPC, EDQUOT
	CodeFileTooLarge       = "file_too_large"         // EFBIG, or past WriteOptions.MaxBytes
	CodeTooManyEntries     = "too_many_entries"       // a listing past MaxListEntries
	CodeReadOnly           = "read_only"              // EROFS: a read-only file system
	CodeReadOnlyPath       = "read_only_path"         // a path the phase does not let be written
	CodePermissionDenied   = "permission_denied"      // EACCES, EPERM
	CodeTooManyOpenFiles   = "too_many_open_files"    // EMFILE, ENFILE
	CodeFileIOError        = "file_io_error"          // EIO, and any errno not listed here
	CodeCanceled           = "canceled"               // the request or the sandbox ended
)

// FileCodes are the files API's codes and their classes.
var FileCodes = map[string]errdefs.Class{
	CodeInvalidPath:        errdefs.Invalid,
	CodePathOutsideRoot:    errdefs.Invalid,
	CodePathIsRoot:         errdefs.Invalid,
	CodeFileNotFound:       errdefs.NotFound,
	CodeParentNotFound:     errdefs.NotFound,
	CodeParentNotDirectory: errdefs.NotFound,
	CodeNotADirectory:      errdefs.Invalid,
	CodeIsADirectory:       errdefs.Invalid,
	CodeNotAFile:           errdefs.Invalid,
	CodeNameTooLong:        errdefs.Invalid,
	CodeSymlinkLoop:        errdefs.Invalid,
	CodeFileExists:         errdefs.Conflict,
	CodeDirectoryNotEmpty:  errdefs.Conflict,
	CodeInvalidOperation:   errdefs.Invalid,
	CodeCrossDevice:        errdefs.Invalid,
	CodeFileBusy:           errdefs.Conflict,
	CodeWorkspaceFull:      errdefs.TooLarge,
	CodeFileTooLarge:       errdefs.TooLarge,
	CodeTooManyEntries:     errdefs.TooLarge,
	CodeReadOnly:           errdefs.PermissionDenied,
	CodeReadOnlyPath:       errdefs.PermissionDenied,
	CodePermissionDenied:   errdefs.PermissionDenied,
	CodeTooManyOpenFiles:   errdefs.Unavailable,
	CodeFileIOError:        errdefs.Internal,
	CodeCanceled:           errdefs.Unavailable,
}

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
		return errdefs.Wrap(errdefs.NotFound, "sandbox_not_found", err, "the sandbox is gone")
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
