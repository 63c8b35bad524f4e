package function

import (
	"fmt"
	"io/fs"
	"os"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/experimental/sysfs"
)

// What the guest sees. wazero's WASI layer refuses paths that leave a
// mount lexically ("..", path.Clean + fs.ValidPath), but its host
// directory FS follows symlinks on the host and lets the guest create
// them, so a guest could plant ../../etc and walk out. Hence:
//
//   - /workspace is a host directory FS that refuses to create symlinks.
//     The files API never creates symlinks either, so the workspace holds
//     none for the host FS to follow.
//   - / is the image through an os.Root, which resolves symlinks only
//     inside the image, made read-only.

// workspaceFS is the guest's /workspace.
type workspaceFS struct {
	experimentalsys.FS
}

func newWorkspaceFS(dir string) experimentalsys.FS {
	return workspaceFS{sysfs.DirFS(dir)}
}

// Modes of what commands create in the workspace. WASI has no file
// modes: wazero creates files 0600 and directories 0700. The other tiers'
// commands run with umask 022 and a program's files come out 0644,
// directories 0755; these are the same, so that a file means the same to
// the files API (and to a grading that carries the workspace) whatever
// the tier made it.
const (
	createdFileMode = 0o644
	createdDirMode  = 0o755
)

// OpenFile creates files createdFileMode.
func (w workspaceFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	if flag&experimentalsys.O_CREAT != 0 {
		perm = createdFileMode
	}
	return w.FS.OpenFile(p, flag, perm)
}

// Mkdir creates directories createdDirMode.
func (w workspaceFS) Mkdir(p string, _ fs.FileMode) experimentalsys.Errno {
	return w.FS.Mkdir(p, createdDirMode)
}

// Symlink refuses: a symlink is a way out of the workspace.
func (workspaceFS) Symlink(string, string) experimentalsys.Errno {
	return experimentalsys.EPERM
}

// image is an image tree opened for sandboxes.
type image struct {
	path string
	ino  uint64
	root *os.Root
	fs   experimentalsys.FS // the guest's read-only /
}

func openImage(path string) (*image, error) {
	root, err := os.OpenRoot(path)
	if err != nil {
		return nil, fmt.Errorf("opening image %s: %w", path, err)
	}
	fi, err := root.Stat(".")
	if err != nil {
		root.Close()
		return nil, fmt.Errorf("opening image %s: %w", path, err)
	}
	return &image{
		path: path,
		ino:  inode(fi),
		root: root,
		fs:   &sysfs.ReadFS{FS: &sysfs.AdaptFS{FS: root.FS()}},
	}, nil
}
