package sandbox

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Workdir is every sandbox's working directory, on every tier: commands
// that name no cwd start there, and relative paths (of the files API and
// of a command's cwd) are taken relative to it. One directory for both is
// what makes "write x/f, then run cat x/f" work the same on each tier.
// Tiers make sure it exists (the function tier's workspace is mounted
// there; the others create it in the sandbox's root if the image lacks
// it: MakeWorkdir).
const Workdir = "/workspace"

// MakeWorkdir creates Workdir (mode 0755) in root, the host path of a
// sandbox's root directory, unless the image has it already: the tiers
// whose images may lack it (container, microvm, vm) call it while they
// build the root, before any command runs.
func MakeWorkdir(root string) error {
	err := os.Mkdir(filepath.Join(root, Workdir), 0o755)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	return err
}

// MaxPathLen bounds paths accepted from users.
const MaxPathLen = 4096

// MaxNameLen bounds each name in a path (Linux's NAME_MAX).
const MaxNameLen = 255

// CleanPath resolves a user-supplied path to a clean absolute path inside
// root (an absolute, clean directory such as "/workspace" or "/", which
// holds Workdir). Relative paths are taken relative to Workdir, absolute
// ones as they are. Paths that leave root, lexically or by "..", relative
// paths with "..", paths with NUL bytes and names longer than MaxNameLen
// are refused with class Invalid. Symlinks are the runtime's business: it
// must resolve the result without following links out of root (os.Root,
// openat2 RESOLVE_IN_ROOT).
func CleanPath(root, p string) (string, error) {
	if p == "" {
		return "", errdefs.New(errdefs.Invalid, CodeInvalidPath, "path is empty")
	}
	if len(p) > MaxPathLen {
		return "", errdefs.New(errdefs.Invalid, CodeInvalidPath, "path is longer than %d bytes", MaxPathLen)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errdefs.New(errdefs.Invalid, CodeInvalidPath, "path contains a NUL byte")
	}
	raw := p
	for _, part := range strings.Split(p, "/") {
		if len(part) > MaxNameLen {
			return "", errdefs.New(errdefs.Invalid, CodeNameTooLong, "the name %.40q… in the path is %d bytes long, more than %d", part, len(part), MaxNameLen)
		}
	}
	if !path.IsAbs(p) {
		// Refuse "../" in relative paths outright rather than letting
		// path.Join quietly fold it back into the working directory.
		for _, part := range strings.Split(p, "/") {
			if part == ".." {
				return "", errdefs.New(errdefs.Invalid, CodePathOutsideRoot, "path %q uses ..; give a path inside %s", raw, Workdir)
			}
		}
		p = path.Join(Workdir, p)
	} else {
		for _, part := range strings.Split(p, "/") {
			if part == ".." {
				return "", errdefs.New(errdefs.Invalid, CodePathOutsideRoot, "path %q uses ..; give a path inside %s", raw, root)
			}
		}
		p = path.Clean(p)
	}
	if !Within(root, p) {
		return "", errdefs.New(errdefs.Invalid, CodePathOutsideRoot, "path %q is outside %s", raw, root)
	}
	return p, nil
}

// Within reports whether clean absolute path p is root or below it.
func Within(root, p string) bool {
	if root == "/" {
		return strings.HasPrefix(p, "/")
	}
	return p == root || strings.HasPrefix(p, root+"/")
}

// RelPath returns p (clean, inside root) relative to root; root itself is ".".
func RelPath(root, p string) string {
	if p == root {
		return "."
	}
	if root == "/" {
		return strings.TrimPrefix(p, "/")
	}
	return strings.TrimPrefix(p, root+"/")
}
