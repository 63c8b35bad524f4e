package layer

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// tent is one tar entry of a test archive.
type tent struct {
	name     string
	typ      byte
	mode     int64
	uid, gid int
	data     []byte
	link     string
	xattrs   map[string]string
	size     int64 // if set, overrides len(data) in the header
}

func file(name string, mode int64, data []byte) tent {
	return tent{name: name, typ: tar.TypeReg, mode: mode, data: data}
}
func dir(name string, mode int64) tent { return tent{name: name, typ: tar.TypeDir, mode: mode} }
func symlink(name, target string) tent {
	return tent{name: name, typ: tar.TypeSymlink, mode: 0o777, link: target}
}
func hlink(name, target string) tent {
	return tent{name: name, typ: tar.TypeLink, mode: 0o644, link: target}
}

func (e tent) owned(uid, gid int) tent              { e.uid, e.gid = uid, gid; return e }
func (e tent) withXattrs(xs map[string]string) tent { e.xattrs = xs; return e }

// makeTar writes the entries as a PAX tar archive.
func makeTar(t testing.TB, ents ...tent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid, Linkname: e.link, Format: tar.FormatPAX}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.data))
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("writing %s: %v", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gz(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// expect computes the tree an archive (or a stack of layers) should
// produce. Entries apply in order; later ones replace earlier ones; parent
// directories are created as 0755 root-owned directories. With
// whiteouts, .wh. entries apply as in BuildOCI (each slice is a layer).
func expect(layers [][]tent, whiteouts bool) map[string]snap {
	type ent struct {
		s     snap
		inode *int
	}
	tree := map[string]*ent{"": {s: snap{Type: "d", Mode: 0o755}}}
	var ids int
	mkdirs := func(p string) {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := tree[d]; !ok {
				tree[d] = &ent{s: snap{Type: "d", Mode: 0o755}}
			}
		}
	}
	remove := func(p string, keep func(string) bool) {
		for k := range tree {
			if (k == p || strings.HasPrefix(k, p+"/")) && !keep(k) {
				delete(tree, k)
			}
		}
	}
	for _, layer := range layers {
		added := map[string]bool{}
		for _, e := range layer {
			p := strings.Trim(path.Clean("/"+e.name), "/")
			base := path.Base(p)
			if whiteouts && strings.HasPrefix(base, ".wh.") {
				dir := path.Dir(p)
				if dir == "." {
					dir = ""
				}
				if base == ".wh..wh..opq" {
					remove(dir, func(k string) bool { return k == dir || added[k] })
				} else {
					remove(path.Join(dir, base[4:]), func(k string) bool { return added[k] })
				}
				continue
			}
			mkdirs(p)
			for d := path.Dir(p); d != "."; d = path.Dir(d) {
				added[d] = true
			}
			added[p] = true
			mode := fs.FileMode(e.mode & 0o777)
			if e.mode&0o4000 != 0 {
				mode |= fs.ModeSetuid
			}
			if e.mode&0o2000 != 0 {
				mode |= fs.ModeSetgid
			}
			if e.mode&0o1000 != 0 {
				mode |= fs.ModeSticky
			}
			s := snap{Mode: mode, UID: uint32(e.uid), GID: uint32(e.gid)}
			if len(e.xattrs) > 0 {
				s.Xattrs = e.xattrs
			}
			switch e.typ {
			case tar.TypeDir:
				s.Type = "d"
			case tar.TypeSymlink:
				s.Type, s.Mode, s.Target = "l", 0, e.link
			case tar.TypeReg:
				s.Type, s.Size, s.SHA = "f", int64(len(e.data)), sha(e.data)
				ids++
				id := ids
				tree[p] = &ent{s: s, inode: &id}
				continue
			case tar.TypeLink:
				tree[p] = tree[e.link]
				continue
			}
			if old, ok := tree[p]; ok && old.s.Type == "d" && s.Type == "d" {
				old.s = s
				continue
			}
			if s.Type != "d" {
				remove(p, func(string) bool { return false })
			}
			tree[p] = &ent{s: s}
		}
	}
	out := map[string]snap{}
	groups := map[*int][]string{}
	for p, e := range tree {
		out[p] = e.s
		if e.inode != nil {
			groups[e.inode] = append(groups[e.inode], p)
		}
	}
	for _, ps := range groups {
		if len(ps) > 1 {
			sort.Strings(ps)
			for _, p := range ps {
				s := out[p]
				s.Link = ps[0]
				out[p] = s
			}
		}
	}
	return out
}

// roundTripEntries covers sizes, modes, owners, xattrs, links, implicit
// directories and replaced entries.
func roundTripEntries() []tent {
	five := testenv.RandBytes(11, 5<<20)
	return []tent{
		dir("./", 0o755),
		dir("etc/", 0o755),
		file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n")),
		dir("bin/", 0o755),
		file("bin/su", 0o4755, testenv.RandBytes(12, 900)),
		file("bin/wall", 0o2755, testenv.RandBytes(13, 800)).owned(0, 5),
		file("bin/ping", 0o755, testenv.RandBytes(14, 3000)).withXattrs(map[string]string{
			"security.capability": string(capV2()),
			"user.origin":         "test",
			"trusted.x":           "y",
		}),
		dir("tmp/", 0o1777),
		file("five.bin", 0o644, five),
		file("five-again.bin", 0o600, five), // stored once in the blob
		file("mid.bin", 0o640, testenv.RandBytes(15, 1<<20+7)).owned(100000, 100001),
		file("zero", 0o600, nil),
		file("owned", 0o600, []byte("x")).owned(65534, 65534),
		symlink("rel-link", "etc/passwd"),
		symlink("abs-link", "/etc/shadow"),
		symlink("dangling", "no/such/file").owned(3, 4),
		hlink("hard", "etc/passwd"),
		hlink("bin/hard2", "etc/passwd"),
		file("deep/a/b/c/file", 0o644, []byte("implicit parents\n")),
		dir("emptydir/", 0o700).withXattrs(map[string]string{"user.dir": "x"}),
		file("replaced", 0o644, testenv.RandBytes(16, 10000)),
		file("replaced", 0o600, []byte("second version\n")),
		file(".wh.kept", 0o644, []byte("not a whiteout in a plain tar")),
	}
}

func TestBuildTarRoundTrip(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	ents := roundTripEntries()
	raw := makeTar(t, ents...)
	for _, tc := range []struct {
		name  string
		input []byte
	}{{"plain", raw}, {"gzip", gz(t, raw)}} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := BuildTar(ctx, bytes.NewReader(tc.input), t.TempDir(), BuildOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := a.Manifest.Source, (Source{Kind: SourceTar, Digest: Digest(tc.input)}); got != want {
				t.Errorf("source %+v, want %+v", got, want)
			}
			if a.Manifest.Builder.Name != "go-erofs" || a.Manifest.Builder.Version == "" {
				t.Errorf("builder %+v", a.Manifest.Builder)
			}
			mnt := mountLayer(t, a)
			diffTrees(t, expect([][]tent{ents}, false), snapshot(t, mnt))
			checkBlobIsLive(t, a, snapshot(t, mnt))
			// Inode numbers are never 0 (go-erofs puts the root at nid 0).
			var st []string
			for _, p := range []string{".", "etc", "bin/su"} {
				fi, err := os.Lstat(filepath.Join(mnt, p))
				if err != nil {
					t.Fatal(err)
				}
				if ino := inodeOf(fi); ino == 0 {
					st = append(st, p)
				}
			}
			if len(st) > 0 {
				t.Errorf("inode 0 at %q", st)
			}
			checkUnchanged(t, a)
		})
	}
}

func TestBuildTarReproducible(t *testing.T) {
	ctx := context.Background()
	raw := makeTar(t, roundTripEntries()...)
	a1, err := BuildTar(ctx, bytes.NewReader(raw), t.TempDir(), BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := BuildTar(ctx, bytes.NewReader(makeTar(t, roundTripEntries()...)), t.TempDir(), BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a1.ID() != a2.ID() || fmt.Sprint(a1.Manifest) != fmt.Sprint(a2.Manifest) {
		t.Fatalf("same tar, different layers:\n%+v\n%+v", a1.Manifest, a2.Manifest)
	}
	ents := roundTripEntries()
	ents[2].data = []byte("root:x:0:0:root:/root:/bin/sH\n")
	a3, err := BuildTar(ctx, bytes.NewReader(makeTar(t, ents...)), t.TempDir(), BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a3.ID() == a1.ID() || a3.Manifest.Meta == a1.Manifest.Meta && a3.Manifest.Blob == a1.Manifest.Blob {
		t.Fatal("a changed byte did not change the layer")
	}
}

// tarHeaderBlock returns one ustar header block for name with the size
// field set to raw bytes (to write sizes archive/tar refuses to).
func tarHeaderBlock(t testing.TB, name string, size []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: 1, Format: tar.FormatUSTAR}); err != nil {
		t.Fatal(err)
	}
	h := buf.Bytes()[:512]
	copy(h[124:136], size)
	copy(h[148:156], "        ")
	var sum int
	for _, c := range h {
		sum += int(c)
	}
	copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return h
}

// bigPAX is an archive whose first header is a 5 MiB PAX record (which
// archive/tar's writer refuses to write).
func bigPAX(t testing.TB) []byte {
	val := strings.Repeat("x", 5<<20)
	rec := "SCHILY.xattr.user.big=" + val + "\n"
	n := len(rec) + 8
	rec = fmt.Sprintf("%d %s", n, rec)
	if len(rec) != n {
		t.Fatalf("record length %d != %d", len(rec), n)
	}
	h := tarHeaderBlock(t, "PaxHeaders/f", []byte(fmt.Sprintf("%011o\x00", len(rec))))
	h[156] = tar.TypeXHeader
	copy(h[148:156], "        ")
	var sum int
	for _, c := range h {
		sum += int(c)
	}
	copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
	body := []byte(rec)
	body = append(body, make([]byte, -len(body)&511)...)
	out := append(h, body...)
	return append(out, makeTar(t, file("f", 0o644, nil))...)
}

func TestBuildTarAttacks(t *testing.T) {
	ctx := context.Background()
	evil := fmt.Sprintf("dsec-evil-%d", os.Getpid())
	bombTar := makeTar(t, file("bomb", 0o644, make([]byte, 24<<20)))
	padBomb := append(makeTar(t, file("ok", 0o644, []byte("x"))), make([]byte, 24<<20)...)
	for _, tc := range []struct {
		name  string
		input []byte
		opt   BuildOptions
		class errdefs.Class
		code  string
	}{
		{"dotdot", makeTar(t, file("../"+evil, 0o644, []byte("x"))), BuildOptions{}, errdefs.Invalid, "tar_unsafe_path"},
		{"dotdot-deep", makeTar(t, file("a/../../"+evil, 0o644, []byte("x"))), BuildOptions{}, errdefs.Invalid, "tar_unsafe_path"},
		{"dotdot-twice", makeTar(t, file("../../"+evil, 0o644, []byte("x"))), BuildOptions{}, errdefs.Invalid, "tar_unsafe_path"},
		{"absolute", makeTar(t, file("/etc/"+evil, 0o644, []byte("x"))), BuildOptions{}, errdefs.Invalid, "tar_unsafe_path"},
		{"absolute-dir", makeTar(t, dir("/tmp/"+evil+"/", 0o755)), BuildOptions{}, errdefs.Invalid, "tar_unsafe_path"},
		{"symlink-abs-then-write", makeTar(t, symlink("l", "/tmp"), file("l/"+evil, 0o644, []byte("x"))), BuildOptions{}, errdefs.Invalid, "tar_unsafe_path"},
		{"symlink-up-then-write", makeTar(t, symlink("l", ".."), file("l/"+evil, 0o644, []byte("x"))), BuildOptions{}, errdefs.Invalid, "tar_unsafe_path"},
		{"symlink-then-dir", makeTar(t, dir("d/", 0o755), symlink("d/l", "/"), dir("d/l/tmp/", 0o755)), BuildOptions{}, errdefs.Invalid, "tar_unsafe_path"},
		{"hardlink-etc-passwd", makeTar(t, hlink("p", "/etc/passwd")), BuildOptions{}, errdefs.Invalid, "tar_hardlink"},
		{"hardlink-outside", makeTar(t, hlink("p", "../outside")), BuildOptions{}, errdefs.Invalid, "tar_hardlink"},
		{"hardlink-missing", makeTar(t, hlink("p", "later"), file("later", 0o644, nil)), BuildOptions{}, errdefs.Invalid, "tar_hardlink"},
		{"hardlink-to-dir", makeTar(t, dir("d/", 0o755), hlink("p", "d")), BuildOptions{}, errdefs.Invalid, "tar_hardlink"},
		{"hardlink-to-symlink", makeTar(t, symlink("s", "/etc/passwd"), hlink("p", "s")), BuildOptions{}, errdefs.Invalid, "tar_hardlink"},
		{"hardlink-through-symlink", makeTar(t, dir("d/", 0o755), file("d/f", 0o644, nil), symlink("s", "d"), hlink("p", "s/f")), BuildOptions{}, errdefs.Invalid, "tar_hardlink"},
		{"char-device", makeTar(t, tent{name: "dev/null", typ: tar.TypeChar, mode: 0o666}), BuildOptions{}, errdefs.Invalid, "tar_device"},
		{"block-device", makeTar(t, tent{name: "dev/sda", typ: tar.TypeBlock, mode: 0o660}), BuildOptions{}, errdefs.Invalid, "tar_device"},
		{"fifo", makeTar(t, tent{name: "fifo", typ: tar.TypeFifo, mode: 0o644}), BuildOptions{}, errdefs.Invalid, "tar_device"},
		{"pax-5MiB", bigPAX(t), BuildOptions{}, errdefs.Invalid, "tar_header_too_large"},
		{"gzip-trailing-garbage", append(gz(t, makeTar(t, file("a", 0o644, nil))), 0, 0, 0), BuildOptions{}, errdefs.Invalid, "tar_truncated"},
		{"name-10000", makeTar(t, file(strings.Repeat("a/", 4999)+"b", 0o644, nil)), BuildOptions{}, errdefs.Invalid, "tar_name_too_long"},
		{"component-300", makeTar(t, file(strings.Repeat("a", 300), 0o644, nil)), BuildOptions{}, errdefs.Invalid, "tar_name_too_long"},
		{"size-minus-1", append(tarHeaderBlock(t, "f", bytes.Repeat([]byte{0xff}, 12)), make([]byte, 1024)...), BuildOptions{}, errdefs.Invalid, "tar_malformed"},
		{"huge-size-short-body", append(tarHeaderBlock(t, "f", []byte("77777777777\x00")), make([]byte, 4096)...), BuildOptions{}, errdefs.Invalid, "tar_truncated"},
		{"huge-size-over-limit", append(tarHeaderBlock(t, "f", []byte("77777777777\x00")), make([]byte, 4096)...), BuildOptions{MaxBytes: 1 << 20}, errdefs.TooLarge, "tar_too_large"},
		{"truncated", makeTar(t, file("f", 0o644, testenv.RandBytes(1, 100000)))[:50000], BuildOptions{}, errdefs.Invalid, "tar_truncated"},
		{"garbage", testenv.RandBytes(7, 10000), BuildOptions{}, errdefs.Invalid, "tar_malformed"},
		{"garbage-gzip", append([]byte{0x1f, 0x8b, 8, 0}, testenv.RandBytes(8, 1000)...), BuildOptions{}, errdefs.Invalid, "tar_malformed"},
		{"gzip-bomb-file", gz(t, bombTar), BuildOptions{MaxBytes: 8 << 20}, errdefs.TooLarge, "tar_too_large"},
		{"gzip-bomb-padding", gz(t, padBomb), BuildOptions{MaxBytes: 8 << 20}, errdefs.TooLarge, "tar_too_large"},
		{"too-many-entries", makeTar(t, file("a", 0o644, nil), file("b", 0o644, nil), file("c", 0o644, nil)), BuildOptions{MaxEntries: 2}, errdefs.TooLarge, "tar_too_many_entries"},
		{"xattr-overlay", makeTar(t, dir("d/", 0o755).withXattrs(map[string]string{"trusted.overlay.opaque": "y"})), BuildOptions{}, errdefs.Invalid, "tar_xattr"},
		{"xattr-acl", makeTar(t, file("f", 0o644, nil).withXattrs(map[string]string{"system.posix_acl_access": "\x02\x00\x00\x00"})), BuildOptions{}, errdefs.Invalid, "tar_xattr"},
		{"file-then-child", makeTar(t, file("f", 0o644, nil), file("f/g", 0o644, nil)), BuildOptions{}, errdefs.Invalid, "tar_path_conflict"},
		{"root-as-file", makeTar(t, file(".", 0o644, nil)), BuildOptions{}, errdefs.Invalid, "tar_path_conflict"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			out := filepath.Join(parent, "out")
			cwd, _ := os.Getwd()
			before := dirNames(t, cwd)
			_, err := BuildTar(ctx, bytes.NewReader(tc.input), out, tc.opt)
			testenv.WantError(t, err, tc.class, tc.code)
			if n := dirNames(t, out); len(n) != 0 {
				t.Errorf("failed build left %q in its output directory", n)
			}
			if n := dirNames(t, parent); len(n) != 1 || n[0] != "out" {
				t.Errorf("build wrote next to its output directory: %q", n)
			}
			for _, d := range []string{"/tmp", "/", "/etc", os.TempDir(), filepath.Dir(parent)} {
				for _, n := range dirNames(t, d) {
					if strings.HasPrefix(n, evil) {
						t.Errorf("%s/%s was created", d, n)
					}
				}
			}
			if after := dirNames(t, cwd); len(after) != len(before) {
				t.Errorf("the working directory changed: %q -> %q", before, after)
			}
		})
	}
}

func TestBuildTarAccepts(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		input []byte
	}{
		{"empty-stream", nil},
		{"empty-archive", makeTar(t)},
		{"dot-slash-names", makeTar(t, file("./a/./b", 0o644, []byte("x")), file("a//c", 0o644, nil))},
		{"exact-limit", makeTar(t, file("a", 0o644, make([]byte, 1000)))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := BuildTar(ctx, bytes.NewReader(tc.input), t.TempDir(), BuildOptions{}); err != nil {
				t.Fatalf("%s/%s: %v", errdefs.ClassOf(err), errdefs.CodeOf(err), err)
			}
		})
	}
	t.Run("limit-exact", func(t *testing.T) {
		raw := makeTar(t, file("a", 0o644, make([]byte, 1000)))
		if _, err := BuildTar(ctx, bytes.NewReader(raw), t.TempDir(), BuildOptions{MaxBytes: int64(len(raw))}); err != nil {
			t.Fatalf("an archive of exactly MaxBytes: %v", err)
		}
		_, err := BuildTar(ctx, bytes.NewReader(raw), t.TempDir(), BuildOptions{MaxBytes: int64(len(raw)) - 1})
		testenv.WantError(t, err, errdefs.TooLarge, "tar_too_large")
	})
	t.Run("canceled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		out := t.TempDir()
		if _, err := BuildTar(cctx, bytes.NewReader(makeTar(t, roundTripEntries()...)), out, BuildOptions{}); err == nil {
			t.Fatal("a canceled build succeeded")
		}
		if n := dirNames(t, out); len(n) != 0 {
			t.Errorf("canceled build left %q", n)
		}
	})
}

// checkBlobIsLive checks that the blob holds each distinct file content
// once, block-aligned, and nothing else (replaced and deleted files'
// data is dropped).
func checkBlobIsLive(t testing.TB, a Artifact, tree map[string]snap) {
	t.Helper()
	var want int64
	seen := map[string]bool{}
	for _, s := range tree {
		if s.Type == "f" && !seen[s.SHA] && s.Size > 0 {
			seen[s.SHA] = true
			want += (s.Size + blockSize - 1) / blockSize * blockSize
		}
	}
	if a.Manifest.Blob.Size != want {
		t.Errorf("blob is %d bytes, want %d", a.Manifest.Blob.Size, want)
	}
}
