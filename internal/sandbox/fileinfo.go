package sandbox

import (
	"io/fs"
	"os"
	"path"

	"github.com/dsec-dev/dsec/api"
)

// FileInfo describes the file at abs (its path as users see it) for the
// files API, from what a stat of it returned. Directories have size 0.
func FileInfo(abs string, fi fs.FileInfo) api.FileInfo {
	info := api.FileInfo{
		Name:    path.Base(abs),
		Path:    abs,
		Size:    fi.Size(),
		Mode:    uint32(fi.Mode().Perm()),
		ModTime: fi.ModTime(),
	}
	switch {
	case fi.Mode().IsRegular():
		info.Type = api.FileTypeFile
	case fi.IsDir():
		info.Type = api.FileTypeDir
		info.Size = 0
	case fi.Mode()&fs.ModeSymlink != 0:
		info.Type = api.FileTypeSymlink
	default:
		info.Type = api.FileTypeOther
	}
	return info
}

// Lstat describes rel in root, the file users see at abs, without
// following a final symlink (whose target it reports). Errors are the
// os.Root's, for the tier to classify.
func Lstat(root *os.Root, abs, rel string) (api.FileInfo, error) {
	fi, err := root.Lstat(rel)
	if err != nil {
		return api.FileInfo{}, err
	}
	info := FileInfo(abs, fi)
	if info.Type == api.FileTypeSymlink {
		info.Target, _ = root.Readlink(rel)
	}
	return info, nil
}
