package layer

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// ociLayers are the three layers of the test image: layer 2 deletes a
// file and a directory with whiteouts and replaces files (one of them
// hard-linked), layer 3 makes a directory opaque and brings a deleted file
// back.
func ociLayers() [][]tent {
	return [][]tent{{
		dir("etc/", 0o755),
		file("etc/passwd", 0o644, []byte("root:x:0:0::/root:/bin/sh\n")),
		file("etc/deleted", 0o644, []byte("to be deleted\n")),
		file("etc/keep", 0o600, []byte("kept\n")).owned(1000, 1000),
		dir("opq/", 0o755),
		file("opq/old1", 0o644, []byte("old\n")),
		dir("opq/sub/", 0o755),
		file("opq/sub/old2", 0o644, []byte("old too\n")),
		dir("wdir/", 0o755),
		file("wdir/a", 0o644, []byte("a\n")),
		file("wdir/b", 0o644, []byte("b\n")),
		dir("usr/", 0o755),
		dir("usr/bin/", 0o755),
		file("usr/bin/tool", 0o4755, testenv.RandBytes(21, 5000)).withXattrs(map[string]string{"security.capability": string(capV2())}),
		file("hl1", 0o644, []byte("linked\n")),
		hlink("hl2", "hl1"),
		file("big.bin", 0o644, testenv.RandBytes(22, 2<<20)),
	}, {
		file("etc/.wh.deleted", 0o644, nil),
		file("etc/new", 0o644, []byte("new in layer 2\n")),
		file("etc/passwd", 0o644, []byte("root:x:0:0::/root:/bin/bash\n")),
		file(".wh.wdir", 0o644, nil),
		file("hl1", 0o644, []byte("replaced: the link breaks\n")),
		file("big.bin", 0o644, testenv.RandBytes(23, 2<<20+5)),
		file("nothing/.wh.here", 0o644, nil), // hides nothing, creates nothing
	}, {
		dir("opq/", 0o750),
		file("opq/.wh..wh..opq", 0o644, nil),
		file("opq/new", 0o644, []byte("only this\n")),
		file("etc/deleted", 0o640, []byte("back again\n")),
		symlink("usr/bin/link", "tool"),
	}}
}

func imageOf(t testing.TB, arch string, layers [][]tent) v1.Image {
	t.Helper()
	var ls []v1.Layer
	for _, l := range layers {
		b := makeTar(t, l...)
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, layer)
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

var armLayers = [][]tent{{file("arch", 0o644, []byte("arm64\n"))}}

// writeLayout writes a two-platform OCI image layout and returns its
// directory and the amd64 image.
func writeLayout(t testing.TB) (string, v1.Image) {
	t.Helper()
	amd := imageOf(t, "amd64", ociLayers())
	arm := imageOf(t, "arm64", armLayers)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	dir := filepath.Join(t.TempDir(), "layout")
	if _, err := layout.Write(dir, idx); err != nil {
		t.Fatal(err)
	}
	return dir, amd
}

// tarDir packs a directory into a tar file.
func tarDir(t testing.TB, dir, out string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestBuildOCI(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	dir, amd := writeLayout(t)
	cfgName, err := amd.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	want := expect(ociLayers(), true)

	a, err := BuildOCI(ctx, dir, t.TempDir(), BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Manifest.Source; got != (Source{Kind: SourceOCI, Digest: cfgName.String()}) {
		t.Errorf("source %+v, want the config digest %s", got, cfgName)
	}
	got := snapshot(t, mountLayer(t, a))
	diffTrees(t, want, got)
	checkBlobIsLive(t, a, got)
	for p, content := range map[string]string{"hl2": "linked\n", "hl1": "replaced: the link breaks\n", "etc/deleted": "back again\n", "opq/new": "only this\n"} {
		if got[p].SHA != sha([]byte(content)) {
			t.Errorf("%s does not hold %q", p, content)
		}
	}
	if len(got) != 15 {
		t.Errorf("%d entries in the flattened image, want 15", len(got))
	}
	for _, gone := range []string{"etc/.wh.deleted", ".wh.wdir", "wdir", "opq/old1", "opq/sub", "nothing", "opq/.wh..wh..opq"} {
		if _, ok := got[gone]; ok {
			t.Errorf("%s is in the flattened image", gone)
		}
	}
	checkUnchanged(t, a)

	t.Run("oci-tar", func(t *testing.T) {
		archive := filepath.Join(t.TempDir(), "image.tar")
		tarDir(t, dir, archive)
		scratch := t.TempDir()
		b, err := BuildOCI(ctx, archive, t.TempDir(), BuildOptions{TempDir: scratch})
		if err != nil {
			t.Fatal(err)
		}
		if n := dirNames(t, scratch); len(n) != 0 {
			t.Errorf("the unpacked layout was left behind: %q", n)
		}
		if b.ID() != a.ID() {
			t.Errorf("the layout as a tar built %s, as a directory %s", b.ID(), a.ID())
		}
	})
	t.Run("docker-save", func(t *testing.T) {
		tag, err := name.NewTag("registry.invalid/dsec/test:1")
		if err != nil {
			t.Fatal(err)
		}
		archive := filepath.Join(t.TempDir(), "docker.tar")
		if err := tarball.WriteToFile(archive, tag, amd); err != nil {
			t.Fatal(err)
		}
		d, err := BuildOCI(ctx, archive, t.TempDir(), BuildOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Manifest.Source != (Source{Kind: SourceDocker, Digest: cfgName.String()}) {
			t.Errorf("source %+v", d.Manifest.Source)
		}
		if d.Manifest.Meta != a.Manifest.Meta || d.Manifest.Blob != a.Manifest.Blob {
			t.Error("the same image from `docker save` built different files")
		}
		diffTrees(t, want, snapshot(t, mountLayer(t, d)))
	})
	t.Run("platform", func(t *testing.T) {
		arm, err := BuildOCI(ctx, dir, t.TempDir(), BuildOptions{Platform: "linux/arm64"})
		if err != nil {
			t.Fatal(err)
		}
		diffTrees(t, expect(armLayers, true), snapshot(t, mountLayer(t, arm)))
		_, err = BuildOCI(ctx, dir, t.TempDir(), BuildOptions{Platform: "linux/s390x"})
		testenv.WantError(t, err, errdefs.NotFound, "oci_platform_not_found")
		_, err = BuildOCI(ctx, dir, t.TempDir(), BuildOptions{Platform: "linux"})
		testenv.WantError(t, err, errdefs.Invalid, "oci_platform")
	})
}

func TestBuildOCIRefusals(t *testing.T) {
	ctx := context.Background()
	t.Run("unsafe-layer", func(t *testing.T) {
		img := imageOf(t, "amd64", [][]tent{{file("a", 0o644, nil)}, {symlink("l", "/etc"), file("l/passwd", 0o644, []byte("x"))}})
		dir := filepath.Join(t.TempDir(), "layout")
		if _, err := layout.Write(dir, mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: img})); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "out")
		_, err := BuildOCI(ctx, dir, out, BuildOptions{})
		testenv.WantError(t, err, errdefs.Invalid, "tar_unsafe_path")
		if n := dirNames(t, out); len(n) != 0 {
			t.Errorf("failed build left %q", n)
		}
	})
	t.Run("whiteout-as-dir", func(t *testing.T) {
		img := imageOf(t, "amd64", [][]tent{{file(".wh.x/y", 0o644, nil)}})
		dir := filepath.Join(t.TempDir(), "layout")
		if _, err := layout.Write(dir, mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: img})); err != nil {
			t.Fatal(err)
		}
		_, err := BuildOCI(ctx, dir, t.TempDir(), BuildOptions{})
		testenv.WantError(t, err, errdefs.Invalid, "tar_malformed")
	})
	t.Run("tampered-layer", func(t *testing.T) {
		dir, amd := writeLayout(t)
		ls, err := amd.Layers()
		if err != nil {
			t.Fatal(err)
		}
		h, err := ls[0].Digest()
		if err != nil {
			t.Fatal(err)
		}
		// Same name, other content: the diff_id no longer matches.
		p := filepath.Join(dir, "blobs", h.Algorithm, h.Hex)
		if err := os.WriteFile(p, gz(t, makeTar(t, file("evil", 0o644, []byte("x")))), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err = BuildOCI(ctx, dir, t.TempDir(), BuildOptions{})
		testenv.WantError(t, err, errdefs.Invalid, "oci_diff_id_mismatch")
	})
	t.Run("size-limit-spans-layers", func(t *testing.T) {
		dir, _ := writeLayout(t)
		_, err := BuildOCI(ctx, dir, t.TempDir(), BuildOptions{MaxBytes: 3 << 20})
		testenv.WantError(t, err, errdefs.TooLarge, "tar_too_large")
	})
	t.Run("not-an-image", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "x.tar")
		if err := os.WriteFile(p, makeTar(t, file("hello", 0o644, []byte("x"))), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := BuildOCI(ctx, p, t.TempDir(), BuildOptions{})
		testenv.WantError(t, err, errdefs.Invalid, "oci_unknown_format")
		_, err = BuildOCI(ctx, t.TempDir(), t.TempDir(), BuildOptions{})
		testenv.WantError(t, err, errdefs.Invalid, "oci_unknown_format")
		_, err = BuildOCI(ctx, filepath.Join(t.TempDir(), "missing"), t.TempDir(), BuildOptions{})
		testenv.WantError(t, err, errdefs.NotFound, "oci_not_found")
	})
}
