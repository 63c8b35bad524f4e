package function

import (
	"io/fs"
	"path/filepath"
)

// defaultDiskMB is the workspace cap used when a spec has none.
const defaultDiskMB = 256

// walkUsage adds up the sizes of the files under dir.
func walkUsage(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // files may vanish while we walk
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				total += fi.Size()
			}
		}
		return nil
	})
	return total, err
}
