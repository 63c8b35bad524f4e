package vmkernel

import (
	"bytes"
	"compress/gzip"
	"io"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// cpioFile is an entry read back from a newc archive.
type cpioFile struct {
	Ino, Mode, UID, GID, Nlink, Mtime, Rmajor, Rminor uint64
	Data                                              string
}

// readCpio parses a newc archive, gzip-compressed or not, as the
// kernel's unpacker would.
func readCpio(t *testing.T, gz []byte) (names []string, files map[string]cpioFile) {
	t.Helper()
	if !bytes.HasPrefix(gz, []byte{0x1f, 0x8b}) {
		return parseCpio(t, gz)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	if !zr.ModTime.IsZero() || zr.Name != "" {
		t.Errorf("gzip header has mtime %v, name %q", zr.ModTime, zr.Name)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return parseCpio(t, raw)
}

// parseCpio parses an uncompressed newc archive.
func parseCpio(t *testing.T, raw []byte) (names []string, files map[string]cpioFile) {
	t.Helper()
	files = map[string]cpioFile{}
	align := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; ; {
		h := raw[off:]
		if string(h[:6]) != "070701" {
			t.Fatalf("bad magic at %d: %q", off, h[:6])
		}
		field := func(i int) uint64 {
			v, err := strconv.ParseUint(string(h[6+8*i:14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		size, namesize := int(field(6)), int(field(11))
		name := string(h[110 : 110+namesize-1])
		dataAt := align(110 + namesize)
		if name == "TRAILER!!!" {
			if off+dataAt != len(raw) {
				t.Errorf("%d bytes after the trailer", len(raw)-off-dataAt)
			}
			return names, files
		}
		names = append(names, name)
		files[name] = cpioFile{Ino: field(0), Mode: field(1), UID: field(2), GID: field(3), Nlink: field(4),
			Mtime: field(5), Rmajor: field(9), Rminor: field(10), Data: string(h[dataAt : dataAt+size])}
		off += align(dataAt + size)
	}
}

func TestCpioGzip(t *testing.T) {
	entries := []cpioEntry{
		{Name: "/lib/modules/r/b.ko", Mode: 0o644, Data: []byte("bb")},
		{Name: "init", Mode: 0o755, Data: []byte("#!init")},
		{Name: "dev/console", Mode: cpioChar | 0o600, Major: 5, Minor: 1},
		{Name: "lib/modules/r/a.ko", Mode: 0o644, Data: []byte("a")},
	}
	gz, err := cpioGzip(entries)
	if err != nil {
		t.Fatal(err)
	}
	names, files := readCpio(t, gz)
	want := []string{"dev", "dev/console", "init", "lib", "lib/modules", "lib/modules/r", "lib/modules/r/a.ko", "lib/modules/r/b.ko"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	wantFiles := map[string]cpioFile{
		"dev":                {Ino: 1, Mode: cpioDir | 0o755, Nlink: 2},
		"dev/console":        {Ino: 2, Mode: cpioChar | 0o600, Nlink: 1, Rmajor: 5, Rminor: 1},
		"init":               {Ino: 3, Mode: cpioReg | 0o755, Nlink: 1, Data: "#!init"},
		"lib":                {Ino: 4, Mode: cpioDir | 0o755, Nlink: 2},
		"lib/modules":        {Ino: 5, Mode: cpioDir | 0o755, Nlink: 2},
		"lib/modules/r":      {Ino: 6, Mode: cpioDir | 0o755, Nlink: 2},
		"lib/modules/r/a.ko": {Ino: 7, Mode: cpioReg | 0o644, Nlink: 1, Data: "a"},
		"lib/modules/r/b.ko": {Ino: 8, Mode: cpioReg | 0o644, Nlink: 1, Data: "bb"},
	}
	if diff := cmp.Diff(wantFiles, files); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}

	// The same entries in another order give the same bytes.
	again, err := cpioGzip([]cpioEntry{entries[3], entries[2], entries[1], entries[0]})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gz, again) {
		t.Error("cpioGzip is not reproducible: the same entries gave different bytes")
	}
}

func TestCpioGzipRejects(t *testing.T) {
	tests := []struct {
		name    string
		entries []cpioEntry
	}{
		{"dot", []cpioEntry{{Name: "/", Mode: cpioDir | 0o755}}},
		{"dotdot", []cpioEntry{{Name: "../x", Mode: 0o644}}},
		{"twice", []cpioEntry{{Name: "a", Mode: 0o644}, {Name: "/a", Mode: 0o644}}},
		{"data in a dir", []cpioEntry{{Name: "d", Mode: cpioDir | 0o755, Data: []byte("x")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := cpioGzip(tt.entries); err == nil {
				t.Error("cpioGzip accepted it")
			}
		})
	}
}
