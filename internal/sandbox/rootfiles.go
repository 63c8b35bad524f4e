package sandbox

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// MaxListDepth caps a listing's depth on every tier.
const MaxListDepth = 32

// RootFiles is the files API's operations on a directory tree reached
// only through an os.Root, so that no path, symlink or not, leads out of
// it: the in-sandbox agent serves the sandbox's whole root with it (Name
// "/"), the function tier its workspace (Name "/workspace"). Both thus
// have the same checks, error codes (FileError) and atomic writes. The
// operations take a path as users see it (abs) and as it is in Root
// (rel), which Resolve makes; what a tier adds (a phase's read-only
// paths, a check that the sandbox lives, the path that is the root
// itself, which each refuses in its own words) comes before them.
type RootFiles struct {
	Root *os.Root
	Name string
}

// Resolve cleans a user's path p (CleanPath: a relative one is relative
// to Workdir) and returns it and its path in Root.
func (f RootFiles) Resolve(p string) (abs, rel string, err error) {
	abs, err = CleanPath(f.Name, p)
	if err != nil {
		return "", "", err
	}
	return abs, RelPath(f.Name, abs), nil
}

// Stat describes the file, without following a final symlink.
func (f RootFiles) Stat(abs, rel string) (api.FileInfo, error) {
	info, err := Lstat(f.Root, abs, rel)
	return info, FileError(abs, err)
}

// Write replaces the file with r's content, atomically: a temporary file
// in its directory, renamed over it once complete. An error of r's (the
// request's end) fails the write as FileError classifies it.
func (f RootFiles) Write(abs, rel string, r io.Reader, opt WriteOptions) (api.FileInfo, error) {
	dir := path.Dir(rel)
	if opt.Parents && dir != "." {
		if err := f.Root.MkdirAll(dir, 0o755); err != nil {
			return api.FileInfo{}, FileError(path.Dir(abs), err)
		}
	}
	if fi, err := f.Root.Lstat(rel); err == nil && fi.IsDir() {
		return api.FileInfo{}, errdefs.New(errdefs.Invalid, CodeIsADirectory, "%s is a directory", abs)
	}
	mode := fs.FileMode(opt.Mode).Perm()
	if opt.Mode == 0 {
		mode = 0o644
	}
	// The name need not be secret (O_EXCL refuses a planted file), so
	// math/rand spares the agent's binary the crypto packages.
	var suffix [8]byte
	binary.LittleEndian.PutUint64(suffix[:], rand.Uint64())
	tmp := path.Join(dir, ".dsec-write-"+hex.EncodeToString(suffix[:]))
	fh, err := f.Root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return api.FileInfo{}, errdefs.New(errdefs.NotFound, CodeParentNotFound,
			"directory %s does not exist (write with parents to create it)", path.Dir(abs))
	}
	if err != nil {
		return api.FileInfo{}, FileError(abs, err)
	}
	done := false
	defer func() {
		if !done {
			fh.Close()
			f.Root.Remove(tmp)
		}
	}()
	if opt.MaxBytes > 0 {
		r = io.LimitReader(r, opt.MaxBytes+1)
	}
	n, err := io.Copy(fh, r)
	if err != nil {
		return api.FileInfo{}, FileError(abs, err)
	}
	if opt.MaxBytes > 0 && n > opt.MaxBytes {
		return api.FileInfo{}, errdefs.New(errdefs.TooLarge, CodeFileTooLarge, "%s would be larger than %d bytes", abs, opt.MaxBytes)
	}
	if err := fh.Chmod(mode); err != nil {
		return api.FileInfo{}, FileError(abs, err)
	}
	if err := fh.Close(); err != nil {
		return api.FileInfo{}, FileError(abs, err)
	}
	if err := f.Root.Rename(tmp, rel); err != nil {
		return api.FileInfo{}, FileError(abs, err)
	}
	done = true
	return f.Stat(abs, rel)
}

// List lists the directory, depth levels deep (1 to MaxListDepth),
// sorted by path; a listing past MaxListEntries fails. ctx's end stops it.
func (f RootFiles) List(ctx context.Context, abs, rel string, depth int) ([]api.FileInfo, error) {
	depth = min(max(depth, 1), MaxListDepth)
	fi, err := f.Root.Lstat(rel)
	if err != nil {
		return nil, FileError(abs, err)
	}
	if !fi.IsDir() {
		return nil, errdefs.New(errdefs.Invalid, CodeNotADirectory, "%s is not a directory", abs)
	}
	out := []api.FileInfo{}
	if err := f.walk(ctx, abs, rel, depth, &out); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(x, y api.FileInfo) int { return strings.Compare(x.Path, y.Path) })
	return out, nil
}

func (f RootFiles) walk(ctx context.Context, abs, rel string, depth int, out *[]api.FileInfo) error {
	if err := ctx.Err(); err != nil {
		return FileError(abs, err)
	}
	dir, err := f.Root.Open(rel)
	if err != nil {
		return FileError(abs, err)
	}
	entries, err := dir.ReadDir(-1)
	dir.Close()
	if err != nil {
		return FileError(abs, err)
	}
	for _, e := range entries {
		childAbs, childRel := path.Join(abs, e.Name()), path.Join(rel, e.Name())
		info, err := f.Stat(childAbs, childRel)
		if errdefs.ClassOf(err) == errdefs.NotFound {
			continue // removed while we list
		}
		if err != nil {
			return err
		}
		if len(*out) >= MaxListEntries {
			return errdefs.New(errdefs.TooLarge, CodeTooManyEntries, "the listing has more than %d entries; list less deep", MaxListEntries)
		}
		*out = append(*out, info)
		if info.Type == api.FileTypeDir && depth > 1 {
			if err := f.walk(ctx, childAbs, childRel, depth-1, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// Mkdir makes the directory, and its missing parents if parents is set.
func (f RootFiles) Mkdir(abs, rel string, parents bool) (api.FileInfo, error) {
	var err error
	if parents {
		err = f.Root.MkdirAll(rel, 0o755)
	} else {
		err = f.Root.Mkdir(rel, 0o755)
	}
	if err != nil {
		return api.FileInfo{}, FileError(abs, err)
	}
	return f.Stat(abs, rel)
}

// Remove removes the file or empty directory, or the whole tree if
// recursive is set.
func (f RootFiles) Remove(abs, rel string, recursive bool) error {
	if _, err := f.Root.Lstat(rel); err != nil {
		return FileError(abs, err)
	}
	var err error
	if recursive {
		err = f.Root.RemoveAll(rel)
	} else {
		err = f.Root.Remove(rel)
		if errors.Is(err, syscall.EEXIST) {
			err = &fs.PathError{Op: "remove", Path: rel, Err: syscall.ENOTEMPTY}
		}
	}
	return FileError(abs, err)
}

// Rename renames a file or directory, replacing what is at to.
func (f RootFiles) Rename(fromAbs, fromRel, toAbs, toRel string) (api.FileInfo, error) {
	if _, err := f.Root.Lstat(fromRel); err != nil {
		return api.FileInfo{}, FileError(fromAbs, err)
	}
	if err := f.Root.Rename(fromRel, toRel); err != nil {
		return api.FileInfo{}, FileError(toAbs, err)
	}
	return f.Stat(toAbs, toRel)
}
