package vmkernel

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLoadOrder(t *testing.T) {
	mods := map[string]modInfo{
		"virtio_ring":    {name: "virtio_ring"},
		"virtio":         {name: "virtio", depends: []string{"virtio_ring"}},
		"virtio_net":     {name: "virtio_net", depends: []string{"net_failover", "virtio", "virtio_ring"}},
		"net_failover":   {name: "net_failover", depends: []string{"failover"}},
		"failover":       {name: "failover"},
		"libcrc32c":      {name: "libcrc32c"},
		"crc32c_generic": {name: "crc32c_generic"},
		"erofs":          {name: "erofs", depends: []string{"libcrc32c"}},
		"a":              {name: "a", depends: []string{"b"}},
		"b":              {name: "b", depends: []string{"a"}},
	}
	tests := []struct {
		name    string
		want    []string
		builtin map[string]bool
		order   []string
		wantErr bool
	}{
		{name: "deps first", want: []string{"virtio_net", "crc32c_generic", "erofs"},
			order: []string{"failover", "net_failover", "virtio_ring", "virtio", "virtio_net", "crc32c_generic", "libcrc32c", "erofs"}},
		{name: "listed order kept", want: []string{"virtio_ring", "virtio"}, order: []string{"virtio_ring", "virtio"}},
		{name: "built in left out", want: []string{"virtio", "erofs"}, builtin: map[string]bool{"virtio_ring": true, "erofs": true},
			order: []string{"virtio"}},
		{name: "missing", want: []string{"nope"}, wantErr: true},
		{name: "cycle", want: []string{"a"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := loadOrder(tt.want, mods, tt.builtin)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.order, got); diff != "" {
				t.Errorf("order (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFirstDepends(t *testing.T) {
	for in, want := range map[string]string{
		"linux-image-6.1.0-57-amd64 (= 6.1.192-3)": "linux-image-6.1.0-57-amd64",
		"a | b, c":                    "a",
		" linux-image-6.1.0-57-amd64": "linux-image-6.1.0-57-amd64",
	} {
		if got := firstDepends(in); got != want {
			t.Errorf("firstDepends(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestModuleName(t *testing.T) {
	for in, want := range map[string]string{
		"lib/modules/r/kernel/fs/erofs/erofs.ko":           "erofs",
		"lib/modules/r/kernel/crypto/crc32c-generic.ko.xz": "crc32c_generic",
		"x/virtio_net.ko.zst":                              "virtio_net",
	} {
		if got := moduleName(in); got != want {
			t.Errorf("moduleName(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzVmlinux feeds Vmlinux arbitrary bytes behind a valid setup header:
// it must return an error, not panic.
func FuzzVmlinux(f *testing.F) {
	hdr := make([]byte, 0x400)
	copy(hdr[hdrMagic:], "HdrS")
	hdr[hdrVersion], hdr[hdrVersion+1] = 0x0f, 0x02
	hdr[hdrSetupSects] = 1
	f.Add(hdr, []byte{0xfd, '7', 'z', 'X', 'Z', 0, 0, 1, 0, 0, 0, 0, 'Y', 'Z', 0, 0})
	f.Add(hdr, []byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, hdr, payload []byte) {
		if len(hdr) < 0x400 {
			return
		}
		b := append(append([]byte(nil), hdr[:0x400]...), payload...)
		copy(b[hdrMagic:], "HdrS")
		b[hdrSetupSects] = 1
		putLE32(b[hdrPayloadOffset:], 0)
		putLE32(b[hdrPayloadLength:], uint32(len(payload)))
		Vmlinux(b)
	})
}

func putLE32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

func TestParseCPUInfoTSC(t *testing.T) {
	tests := []struct {
		name, cpuinfo string
		want          int
	}{
		{"constant", "processor\t: 0\ncpu MHz\t\t: 2596.144\nflags\t\t: fpu tsc constant_tsc nonstop_tsc\n\nprocessor\t: 1\ncpu MHz\t\t: 1.0\n", 2596144},
		{"not constant", "processor\t: 0\ncpu MHz\t\t: 2596.144\nflags\t\t: fpu tsc\n", 0},
		{"no MHz", "processor\t: 0\nflags\t\t: constant_tsc\n", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "cpuinfo")
			if err := os.WriteFile(p, []byte(tt.cpuinfo), 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if got := parseCPUInfoTSC(f); got != tt.want {
				t.Errorf("got %d, want %d", got, tt.want)
			}
		})
	}
}

func TestStripSignature(t *testing.T) {
	body := []byte("\x7fELF module body")
	sig := []byte("pkcs7 signature bytes")
	trailer := make([]byte, 12)
	binary.BigEndian.PutUint32(trailer[8:], uint32(len(sig)))
	signed := slices.Concat(body, sig, trailer, []byte(sigMagic))
	for _, tc := range []struct {
		name string
		in   []byte
		want []byte
	}{
		{name: "signed", in: signed, want: body},
		{name: "unsigned", in: body, want: body},
		{name: "bad length", in: slices.Concat([]byte("x"), make([]byte, 8), []byte{0xff, 0, 0, 0}, []byte(sigMagic)), want: nil},
	} {
		got := stripSignature(tc.in)
		if tc.want == nil {
			tc.want = tc.in
		}
		if !bytes.Equal(got, tc.want) {
			t.Errorf("%s: stripSignature = %q, want %q", tc.name, got, tc.want)
		}
	}
}
