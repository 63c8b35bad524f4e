package sys

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// ListXattrs returns the extended attributes of path, without following
// a final symlink, sorted by name. A file system without xattr support
// yields none.
func ListXattrs(path string) ([]Xattr, error) {
	names, err := listxattr(path)
	if err != nil {
		return nil, err
	}
	out := make([]Xattr, 0, len(names))
	for _, n := range names {
		v, err := getxattr(path, n)
		if errors.Is(err, unix.ENODATA) {
			continue // removed since the list was read
		}
		if err != nil {
			return nil, err
		}
		out = append(out, Xattr{Name: n, Value: v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// SetXattr sets the extended attribute name of path (not following a
// final symlink) to value.
func SetXattr(path, name string, value []byte) error {
	if err := unix.Lsetxattr(path, name, value, 0); err != nil {
		return fmt.Errorf("setting xattr %s on %s: %w", name, path, err)
	}
	return nil
}

func listxattr(path string) ([]string, error) {
	for {
		n, err := unix.Llistxattr(path, nil)
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("listing xattrs of %s: %w", path, err)
		}
		if n == 0 {
			return nil, nil
		}
		buf := make([]byte, n)
		n, err = unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) {
			continue // the list grew between the two calls
		}
		if err != nil {
			return nil, fmt.Errorf("listing xattrs of %s: %w", path, err)
		}
		var names []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" {
				names = append(names, s)
			}
		}
		return names, nil
	}
}

func getxattr(path, name string) ([]byte, error) {
	for {
		n, err := unix.Lgetxattr(path, name, nil)
		if err != nil {
			return nil, fmt.Errorf("reading xattr %s of %s: %w", name, path, err)
		}
		buf := make([]byte, n)
		if n == 0 {
			return buf, nil
		}
		n, err = unix.Lgetxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading xattr %s of %s: %w", name, path, err)
		}
		return buf[:n], nil
	}
}

// FileXattr returns the extended attribute name of the open file f, or
// nil when f has none by that name (or its file system has no xattrs).
func FileXattr(f *os.File, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Fgetxattr(int(f.Fd()), name, buf)
		switch {
		case errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP):
			return nil, nil
		case errors.Is(err, unix.ERANGE) && len(buf) < 64<<10:
			buf = make([]byte, 64<<10)
			continue
		case err != nil:
			return nil, fmt.Errorf("reading xattr %s of %s: %w", name, f.Name(), err)
		}
		return buf[:n], nil
	}
}
