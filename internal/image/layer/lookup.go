package layer

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"

	"github.com/erofs/go-erofs"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// noBlob stands for a layer's data.blob when only its metadata is read:
// a lookup never needs file data, and a read of it is an error.
type noBlob struct{}

func (noBlob) ReadAt([]byte, int64) (int, error) {
	return 0, errors.New("layer: file data is not available to a metadata lookup")
}

// StatMeta describes the file at p (absolute, in the layer) from the
// layer's metadata image alone (meta.erofs of mkfs.erofs or go-erofs,
// with data.blob as its one extra device), without following a final
// symlink. A missing file is fs.ErrNotExist; an unreadable image is
// Invalid, code layer_bad_metadata.
func StatMeta(meta io.ReaderAt, p string) (fs.FileInfo, error) {
	fsys, err := erofs.Open(meta, erofs.WithExtraDevices(noBlob{}))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Invalid, api.CodeLayerBadMetadata, err, "reading the layer's metadata image")
	}
	rel := path.Clean(p)
	if !path.IsAbs(rel) {
		return nil, fmt.Errorf("layer lookup of %q: the path must be absolute", p)
	}
	if rel == "/" {
		rel = "."
	} else {
		rel = rel[1:]
	}
	if sfs, ok := fsys.(interface {
		Lstat(string) (fs.FileInfo, error)
	}); ok {
		return sfs.Lstat(rel)
	}
	return fs.Stat(fsys, rel)
}
