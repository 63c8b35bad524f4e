package container

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// reachable makes sure a sandbox's root user can walk down to path.
//
// A sandbox starts as root of its user namespace, which maps to an
// unprivileged host uid: host root's directories are "others" to it, and
// its capabilities do not apply to files of ids its namespace does not
// map. Before pivot_root it must reach its root file system and the
// agent binary on the host, so every directory above them needs search
// permission for others, as Docker's user-namespace remapping requires of
// /var/lib/docker. Directories at or below own (the node's data
// directory) get o+x, which lets one walk through but not list them;
// above own they must already have it, and an error says which does not.
func reachable(path, own string) error {
	path, own = filepath.Clean(path), filepath.Clean(own)
	for p := path; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if !within(p, own) {
				return errdefs.New(errdefs.Unavailable, api.CodePathNotSearchable,
					"container sandboxes must reach %s, but %s denies search to others: chmod o+x %s", path, p, p)
			}
			if err := os.Chmod(p, fi.Mode().Perm()|0o001); err != nil {
				return fmt.Errorf("letting sandboxes reach %s: %w", path, err)
			}
		}
		if p == "/" || p == "." {
			return nil
		}
	}
}

func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}
