package sandbox

import (
	"path"
	"strings"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// MaxPathLen bounds paths accepted from users.
const MaxPathLen = 4096

// MaxNameLen bounds each name in a path (Linux's NAME_MAX).
const MaxNameLen = 255

// CleanPath resolves a user-supplied path to a clean absolute path inside
// root (an absolute, clean directory such as "/workspace" or "/"). Relative
// paths are taken relative to root. Paths that leave root, lexically or by
// "..", paths with NUL bytes and names longer than MaxNameLen are refused
// with class Invalid. Symlinks
// are the runtime's business: it must resolve the result without following
// links out of root (os.Root, openat2 RESOLVE_IN_ROOT).
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
		// path.Join quietly fold it back into root.
		for _, part := range strings.Split(p, "/") {
			if part == ".." {
				return "", errdefs.New(errdefs.Invalid, CodePathOutsideRoot, "path %q leaves %s", raw, root)
			}
		}
		p = path.Join(root, p)
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
