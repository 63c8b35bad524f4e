package layer

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Size bounds of the JSON documents of an image.
const (
	maxIndexSize    = 4 << 20
	maxManifestSize = 4 << 20
	maxConfigSize   = 16 << 20
	maxIndexDepth   = 4
)

// BuildOCI builds one base layer from a container image: an OCI image
// layout directory, an OCI image layout packed as a tar archive, or a
// `docker save` archive (recognised by its manifest.json). For a
// multi-platform index it takes opt.Platform (default linux/amd64); a
// `docker save` archive must hold exactly one image.
//
// All layers are flattened into one: each layer tar goes through the same
// hardened reader as BuildTar (same refusals and codes), AUFS whiteouts
// (.wh.<name>) delete what lower layers put at <name>, opaque markers
// (.wh..wh..opq) hide a directory's lower contents, and the markers never
// appear in the result. Each layer's uncompressed digest must match the
// image config's diff_ids ("oci_diff_id_mismatch").
//
// The source digest is the digest of the image config, which names every
// layer's diff_id: it pins the content, is cheap to get from both formats,
// and does not depend on how the layers were compressed (a manifest digest
// does; for `docker save` archives go-containerregistry would have to
// recompress every layer to compute one).
func BuildOCI(ctx context.Context, src string, outDir string, opt BuildOptions) (Artifact, error) {
	opt = opt.withDefaults()
	want, err := v1.ParsePlatform(opt.Platform)
	if err != nil || want.OS == "" || want.Architecture == "" {
		return Artifact{}, errdefs.New(errdefs.Invalid, api.CodeOCIPlatform, "bad platform %q (want os/arch[/variant])", opt.Platform)
	}
	if err := prepareOutDir(outDir); err != nil {
		return Artifact{}, err
	}
	img, kind, cleanup, err := openImage(ctx, src, *want, opt)
	if err != nil {
		return Artifact{}, err
	}
	defer cleanup()
	a, err := buildImage(ctx, img, kind, outDir, opt)
	if err != nil {
		cleanOutDir(outDir)
		return Artifact{}, err
	}
	return a, nil
}

func ociInvalid(code string, err error, format string, args ...any) error {
	var e *errdefs.Error
	if errors.As(err, &e) {
		return err
	}
	return errdefs.Wrap(errdefs.Invalid, code, err, format, args...)
}

func buildImage(ctx context.Context, img v1.Image, kind, outDir string, opt BuildOptions) (Artifact, error) {
	raw, err := img.RawConfigFile()
	if err != nil {
		return Artifact{}, ociInvalid(api.CodeOCIConfig, err, "cannot read the image config")
	}
	sum := sha256.Sum256(raw)
	configDigest := "sha256:" + hex.EncodeToString(sum[:])
	if name, err := img.ConfigName(); err != nil || name.String() != configDigest {
		return Artifact{}, errdefs.New(errdefs.Invalid, api.CodeOCIDigestMismatch, "the image config does not match its digest %v", name)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(raw))
	if err != nil {
		return Artifact{}, ociInvalid(api.CodeOCIConfig, err, "the image config is not valid")
	}
	layers, err := img.Layers()
	if err != nil {
		return Artifact{}, ociInvalid(api.CodeOCIManifest, err, "cannot list the image layers")
	}
	if len(layers) != len(cfg.RootFS.DiffIDs) {
		return Artifact{}, errdefs.New(errdefs.Invalid, api.CodeOCIConfig, "the image has %d layers but its config names %d", len(layers), len(cfg.RootFS.DiffIDs))
	}
	b := newBudget(opt)
	err = buildTree(ctx, outDir, false, func(t *tree) error {
		for i, l := range layers {
			if err := addImageLayer(ctx, t, l, i, cfg.RootFS.DiffIDs[i].String(), b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return Artifact{}, err
	}
	return finish(ctx, outDir, Source{Kind: kind, Digest: configDigest}, goErofsBuilder("whiteouts=applied", "layers=flattened"), false)
}

func addImageLayer(ctx context.Context, t *tree, l v1.Layer, i int, diffID string, b *budget) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return ociInvalid(api.CodeOCILayerUnreadable, err, "cannot read layer %d", i)
	}
	defer rc.Close()
	tr, err := newTarReader(rc, b)
	if err == nil {
		err = t.addLayer(ctx, tr, i, true)
	}
	var plain string
	if err == nil {
		_, plain, err = tr.Finish()
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return ociInvalid(api.CodeOCILayerUnreadable, err, "cannot read layer %d", i)
	}
	if plain != diffID {
		return errdefs.New(errdefs.Invalid, api.CodeOCIDiffIDMismatch, "layer %d has digest %s, the image config says %s", i, plain, diffID)
	}
	return nil
}

// openImage finds the image at src. cleanup removes what was unpacked.
func openImage(ctx context.Context, src string, want v1.Platform, opt BuildOptions) (img v1.Image, kind string, cleanup func(), err error) {
	cleanup = func() {}
	fi, err := os.Stat(src)
	if err != nil {
		return nil, "", cleanup, errdefs.Wrap(errdefs.NotFound, api.CodeOCINotFound, err, "image %s not found", src)
	}
	if fi.IsDir() {
		img, err := imageFromLayout(src, want)
		return img, SourceOCI, cleanup, err
	}
	entries, err := scanOuterTar(src, opt)
	if err != nil {
		return nil, "", cleanup, err
	}
	switch {
	case hasEntry(entries, "manifest.json"):
		img, err := imageFromDockerSave(src, entries)
		return img, SourceDocker, cleanup, err
	case hasEntry(entries, "oci-layout") && hasEntry(entries, "index.json"):
		dir, err := os.MkdirTemp(opt.TempDir, "dsec-oci-")
		if err != nil {
			return nil, "", cleanup, fmt.Errorf("unpacking OCI layout: %w", err)
		}
		cleanup = func() { _ = os.RemoveAll(dir) } // scratch space: nothing to report
		if err := unpackLayout(ctx, src, dir, opt); err != nil {
			cleanup()
			return nil, "", func() {}, err
		}
		img, err := imageFromLayout(dir, want)
		return img, SourceOCI, cleanup, err
	}
	return nil, "", cleanup, errdefs.New(errdefs.Invalid, api.CodeOCIUnknownFormat,
		"%s is neither an OCI image layout (directory or tar) nor a `docker save` archive", src)
}

func hasEntry(m map[string]int64, name string) bool { _, ok := m[name]; return ok }

// scanOuterTar lists an image archive's regular files and their sizes
// (headers only: data is skipped by seeking).
func scanOuterTar(src string, opt BuildOptions) (map[string]int64, error) {
	f, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	out := map[string]int64{}
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, errdefs.Wrap(errdefs.Invalid, api.CodeOCIUnknownFormat, err,
				"%s is neither an OCI image layout nor a `docker save` archive", src)
		}
		if n >= opt.MaxEntries {
			return nil, errdefs.New(errdefs.TooLarge, api.CodeTarTooManyEntries, "the archive has more than %d entries", opt.MaxEntries)
		}
		if hdr.Typeflag == tar.TypeReg {
			out[path.Clean(hdr.Name)] = hdr.Size
		} else if hdr.Typeflag == tar.TypeSymlink || hdr.Typeflag == tar.TypeLink {
			out[path.Clean(hdr.Name)] = -1 // go-containerregistry follows links inside the archive
		}
	}
}

func imageFromDockerSave(src string, entries map[string]int64) (v1.Image, error) {
	if n := entries["manifest.json"]; n > maxManifestSize || n < 0 {
		return nil, errdefs.New(errdefs.TooLarge, api.CodeOCIManifestTooLarge, "manifest.json is too large")
	}
	f, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var m []struct{ Config string }
	if err := readTarJSON(f, "manifest.json", maxManifestSize, &m); err != nil {
		return nil, err
	}
	if len(m) != 1 {
		return nil, errdefs.New(errdefs.Invalid, api.CodeOCIMultipleImages, "the archive holds %d images, want exactly 1", len(m))
	}
	if n, ok := entries[path.Clean(m[0].Config)]; !ok || n > maxConfigSize || n < 0 {
		return nil, errdefs.New(errdefs.Invalid, api.CodeOCIConfig, "the image config %q is missing, a link or too large", m[0].Config)
	}
	img, err := tarball.ImageFromPath(src, nil)
	if err != nil {
		return nil, ociInvalid(api.CodeOCIManifest, err, "cannot read the `docker save` archive")
	}
	return img, nil
}

// readTarJSON decodes the JSON file name of a tar archive.
func readTarJSON(r io.Reader, name string, limit int64, v any) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err != nil {
			return errdefs.Wrap(errdefs.Invalid, api.CodeOCIManifest, err, "cannot find %s in the archive", name)
		}
		if path.Clean(hdr.Name) != name {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(tr, limit+1))
		if err == nil && int64(len(b)) > limit {
			err = errors.New("too large")
		}
		if err == nil {
			err = json.Unmarshal(b, v)
		}
		if err != nil {
			return errdefs.Wrap(errdefs.Invalid, api.CodeOCIManifest, err, "%s is not valid", name)
		}
		return nil
	}
}

var layoutBlobPath = regexp.MustCompile(`^blobs/(sha256|sha512)/[0-9a-f]{64,128}$`)

// unpackLayout copies an OCI layout's own files (oci-layout, index.json,
// blobs/<alg>/<hex>) out of a tar archive into dir, through the hardened
// reader; everything else is skipped. Only the directories it creates
// itself lie on the paths it writes, so nothing lands outside dir.
func unpackLayout(ctx context.Context, src, dir string, opt BuildOptions) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	tr, err := newTarReader(f, newBudget(opt))
	if err != nil {
		return err
	}
	for _, d := range []string{"blobs", "blobs/sha256", "blobs/sha512"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		e, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if e.Kind != kindFile || !(e.Path == "oci-layout" || e.Path == "index.json" || layoutBlobPath.MatchString(e.Path)) {
			continue
		}
		if e.Path == "index.json" && e.Size > maxIndexSize {
			return errdefs.New(errdefs.TooLarge, api.CodeOCIIndexTooLarge, "index.json is too large")
		}
		out, err := os.OpenFile(filepath.Join(dir, filepath.FromSlash(e.Path)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			if os.IsExist(err) {
				return errdefs.New(errdefs.Invalid, api.CodeTarDuplicate, "the archive holds %s twice", e.Path)
			}
			return err
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
}

// imageFromLayout picks the image for want from the layout at dir.
func imageFromLayout(dir string, want v1.Platform) (v1.Image, error) {
	fi, err := os.Stat(filepath.Join(dir, "index.json"))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Invalid, api.CodeOCIUnknownFormat, err, "%s is not an OCI image layout", dir)
	}
	if fi.Size() > maxIndexSize {
		return nil, errdefs.New(errdefs.TooLarge, api.CodeOCIIndexTooLarge, "index.json is too large")
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, ociInvalid(api.CodeOCIIndex, err, "cannot read the OCI image layout")
	}
	img, err := selectImage(layout.Path(dir), idx, want, 0)
	if err != nil {
		return nil, err
	}
	if img == nil {
		return nil, errdefs.New(errdefs.NotFound, api.CodeOCIPlatformNotFound, "the image has no %s variant", want.String())
	}
	return img, nil
}

// blobSizeOK reports whether the layout's blob h exists and is at most
// limit bytes, before go-containerregistry reads it into memory.
func blobSizeOK(p layout.Path, h v1.Hash, limit int64) bool {
	fi, err := os.Stat(filepath.Join(string(p), "blobs", h.Algorithm, h.Hex))
	return err == nil && fi.Mode().IsRegular() && fi.Size() <= limit
}

func selectImage(p layout.Path, idx v1.ImageIndex, want v1.Platform, depth int) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, ociInvalid(api.CodeOCIIndex, err, "cannot read the image index")
	}
	for _, d := range im.Manifests {
		switch {
		case d.MediaType.IsIndex():
			if depth >= maxIndexDepth || !blobSizeOK(p, d.Digest, maxIndexSize) {
				return nil, errdefs.New(errdefs.Invalid, api.CodeOCIIndex, "image index %s is too deep, missing or too large", d.Digest)
			}
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, ociInvalid(api.CodeOCIIndex, err, "cannot read image index %s", d.Digest)
			}
			img, err := selectImage(p, child, want, depth+1)
			if img != nil || err != nil {
				return img, err
			}
		case d.MediaType.IsImage():
			if d.Platform != nil && !d.Platform.Satisfies(want) {
				continue
			}
			if !blobSizeOK(p, d.Digest, maxManifestSize) {
				return nil, errdefs.New(errdefs.Invalid, api.CodeOCIManifest, "image manifest %s is missing or too large", d.Digest)
			}
			img, err := idx.Image(d.Digest)
			if err != nil {
				return nil, ociInvalid(api.CodeOCIManifest, err, "cannot read image manifest %s", d.Digest)
			}
			m, err := img.Manifest()
			if err != nil {
				return nil, ociInvalid(api.CodeOCIManifest, err, "cannot read image manifest %s", d.Digest)
			}
			if !blobSizeOK(p, m.Config.Digest, maxConfigSize) {
				return nil, errdefs.New(errdefs.Invalid, api.CodeOCIConfig, "image config %s is missing or too large", m.Config.Digest)
			}
			if d.Platform == nil {
				// No platform in the index: ask the config.
				cfg, err := img.ConfigFile()
				if err != nil {
					return nil, ociInvalid(api.CodeOCIConfig, err, "cannot read image config %s", m.Config.Digest)
				}
				if cfg.OS != "" && !(v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant}).Satisfies(want) {
					continue
				}
			}
			return img, nil
		}
	}
	return nil, nil
}
