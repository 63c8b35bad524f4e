package layer

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
)

// goErofsModule is the EROFS writer for archive sources; goErofsVersion
// is its version when the build info does not say (go.mod pins it).
const (
	goErofsModule  = "github.com/erofs/go-erofs"
	goErofsVersion = "v0.3.1"
)

// layoutOptions describes the layout DSec gives go-erofs images: 4 KiB
// blocks, build time 0, all file data in data.blob (device 1) with each
// file contiguous, block-aligned and stored once per distinct content,
// one chunk index per file, and hard links as shared inodes.
var layoutOptions = []string{"-T0", "--blobdev", "block-size=4096", "data=file-contiguous,4k-aligned,file-dedup", "chunk-index=per-file", "dsec-layout=1"}

func goErofsBuilder(extra ...string) Builder {
	v := goErofsVersion
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == goErofsModule {
				v = d.Version
				if d.Replace != nil {
					v = d.Replace.Version
				}
			}
		}
	}
	return Builder{Name: "go-erofs", Version: v, Options: append(append([]string(nil), layoutOptions...), extra...)}
}

// BuildTar builds a layer from a tar stream, plain or gzip-compressed
// (recognised by its magic bytes), into outDir (created if needed; it must
// be empty). The archive is untrusted: it goes through a hardened reader
// and into an EROFS image with github.com/erofs/go-erofs, never onto the
// host file system, so nothing is written outside outDir. Refused, with
// errdefs.Invalid: absolute paths and ".." components
// ("tar_unsafe_path"), entries reached through a symlink of the archive
// ("tar_unsafe_path"), hard links to anything but a regular file earlier in
// the archive ("tar_hardlink"), device nodes and FIFOs ("tar_device"),
// names over 4096 bytes ("tar_name_too_long"), headers or PAX records over
// 1 MiB ("tar_header_too_large"), truncated or malformed archives
// ("tar_truncated", "tar_malformed"), and xattrs EROFS cannot carry or
// that steer overlayfs ("tar_xattr"). Archives past opt.MaxEntries or
// opt.MaxBytes (after decompression) fail with errdefs.TooLarge.
//
// Setuid and setgid bits are kept (layers are mounted nosuid). Later
// entries replace earlier ones at the same path. AUFS whiteout files are
// kept as ordinary files here; BuildOCI applies them.
//
// The source digest is the SHA-256 of the bytes as given (compressed, if
// they were). The artifact is validated before it is returned; on error
// outDir is left without artifact files.
func BuildTar(ctx context.Context, r io.Reader, outDir string, opt BuildOptions) (Artifact, error) {
	opt = opt.withDefaults()
	if err := prepareOutDir(outDir); err != nil {
		return Artifact{}, err
	}
	a, err := buildTar(ctx, r, outDir, opt)
	if err != nil {
		cleanOutDir(outDir)
		return Artifact{}, err
	}
	return a, nil
}

func buildTar(ctx context.Context, r io.Reader, outDir string, opt BuildOptions) (Artifact, error) {
	var digest string
	err := buildTree(ctx, outDir, false, func(t *tree) error {
		tr, err := newTarReader(r, newBudget(opt))
		if err != nil {
			return err
		}
		if err := t.addLayer(ctx, tr, 0, false); err != nil {
			return err
		}
		digest, _, err = tr.Finish()
		return err
	})
	if err != nil {
		return Artifact{}, err
	}
	return finish(ctx, outDir, Source{Kind: SourceTar, Digest: digest}, goErofsBuilder(), false)
}

// buildTree creates the artifact files, lets fill populate the tree (and
// the blob), then writes the metadata image. A scratch build (a
// snapshot's, stored elsewhere at once) is not synced to disk.
func buildTree(ctx context.Context, outDir string, scratch bool, fill func(*tree) error) error {
	blob, err := os.OpenFile(filepath.Join(outDir, BlobFile), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("creating %s: %w", BlobFile, err)
	}
	defer blob.Close()
	meta, err := os.OpenFile(filepath.Join(outDir, MetaFile), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("creating %s: %w", MetaFile, err)
	}
	defer meta.Close()
	t := newTree(blob)
	if err := fill(t); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := t.finishBlob(); err != nil {
		return err
	}
	if _, err := blob.Seek(0, io.SeekEnd); err != nil {
		return err
	}
	if err := t.writeMeta(meta, blob); err != nil {
		return err
	}
	if scratch {
		return nil
	}
	for _, f := range []*os.File{blob, meta} {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	return nil
}
