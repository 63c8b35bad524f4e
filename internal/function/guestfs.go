package function

import (
	"fmt"
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
