package chunks

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testenv"
)

func TestBuildIndex(t *testing.T) {
	const cs = 4096
	for _, tc := range []struct {
		name string
		size int
	}{
		{"empty", 0},
		{"one byte", 1},
		{"a chunk less one", cs - 1},
		{"one chunk", cs},
		{"a chunk and a byte", cs + 1},
		{"three and a half chunks", 3*cs + cs/2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := testenv.RandBytes(uint64(tc.size), tc.size)
			x, err := Build(bytes.NewReader(data), int64(tc.size), cs)
			if err != nil {
				t.Fatal(err)
			}
			if want := Digest(data); x.Digest != want {
				t.Errorf("digest %s, want %s", x.Digest, want)
			}
			var want []string
			for off := 0; off < tc.size; off += cs {
				want = append(want, Digest(data[off:min(off+cs, tc.size)]))
			}
			if !slices.Equal(want, x.Chunks) {
				t.Errorf("chunks %q, want %q", x.Chunks, want)
			}
			if x.Size != int64(tc.size) || x.ChunkSize != cs || x.MediaType != MediaType {
				t.Errorf("index %+v", x)
			}
			// The JSON form round-trips.
			b, err := json.Marshal(x)
			if err != nil {
				t.Fatal(err)
			}
			y, err := Parse(b)
			if err != nil {
				t.Fatalf("Parse(%s): %v", b, err)
			}
			if !x.Equal(y) {
				t.Errorf("round trip: %+v, want %+v", y, x)
			}
		})
	}
}

func TestBuildIndexDefaultChunkSize(t *testing.T) {
	data := testenv.RandBytes(7, DefaultSize+10)
	x, err := Build(bytes.NewReader(data), int64(len(data)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if x.ChunkSize != 1<<20 || len(x.Chunks) != 2 {
		t.Errorf("chunk size %d, %d chunks; want 1 MiB, 2", x.ChunkSize, len(x.Chunks))
	}
}

func TestBuildIndexErrors(t *testing.T) {
	data := testenv.RandBytes(1, 10000)
	if _, err := Build(bytes.NewReader(data), 10001, 4096); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("short reader: %v, want io.ErrUnexpectedEOF", err)
	}
	_, err := Build(bytes.NewReader(data), 9999, 4096)
	testenv.WantError(t, err, errdefs.Invalid, api.CodeInvalidRange)
	for _, cs := range []int{-1, 1000, 2048, 4097, 6000, 32 << 20} {
		_, err := Build(bytes.NewReader(data), 10000, cs)
		testenv.WantError(t, err, errdefs.Invalid, api.CodeInvalidChunkIndex)
	}
	_, err = Build(bytes.NewReader(data), -1, 4096)
	testenv.WantError(t, err, errdefs.Invalid, api.CodeInvalidChunkIndex)
}

// TestParseIndexErrors checks each way Parse rejects an index, and
// that it says which.
func TestParseIndexErrors(t *testing.T) {
	good, err := Build(bytes.NewReader(testenv.RandBytes(2, 10000)), 10000, 4096)
	if err != nil {
		t.Fatal(err)
	}
	encode := func(x Index) string {
		b, err := json.Marshal(x)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	edit := func(f func(*Index)) string {
		x := good
		x.Chunks = append([]string(nil), good.Chunks...)
		f(&x)
		return encode(x)
	}
	for _, tc := range []struct {
		name, json, want string
	}{
		{"not JSON", "{", "not valid JSON"},
		{"not an object", "[]", "not valid JSON"},
		{"unknown field", strings.Replace(encode(good), `{`, `{"extra":1,`, 1), "not valid JSON"},
		{"data after the object", encode(good) + "{}", "data after its JSON object"},
		{"wrong media type", edit(func(x *Index) { x.MediaType = "application/json" }), "media type"},
		{"no media type", edit(func(x *Index) { x.MediaType = "" }), "media type"},
		{"digest without sha256:", edit(func(x *Index) { x.Digest = x.Digest[7:] }), "blob digest"},
		{"digest in upper case", edit(func(x *Index) { x.Digest = strings.ToUpper(x.Digest) }), "blob digest"},
		{"short digest", edit(func(x *Index) { x.Digest = x.Digest[:70] }), "blob digest"},
		{"another algorithm", edit(func(x *Index) { x.Digest = "sha512:" + x.Digest[7:] }), "blob digest"},
		{"negative size", edit(func(x *Index) { x.Size = -1 }), "negative"},
		{"chunk size zero", edit(func(x *Index) { x.ChunkSize = 0 }), "power of two"},
		{"chunk size not a power of two", edit(func(x *Index) { x.ChunkSize = 5000 }), "power of two"},
		{"chunk size below 4 KiB", edit(func(x *Index) { x.ChunkSize = 2048 }), "power of two"},
		{"chunk size above 16 MiB", edit(func(x *Index) { x.ChunkSize = 32 << 20 }), "power of two"},
		{"too few chunks", edit(func(x *Index) { x.Chunks = x.Chunks[:2] }), "want 3"},
		{"too many chunks", edit(func(x *Index) { x.Chunks = append(x.Chunks, x.Chunks[0]) }), "want 3"},
		{"size beyond the chunks", edit(func(x *Index) { x.Size = 3*4096 + 1 }), "want 4"},
		{"no chunks for a size", edit(func(x *Index) { x.Chunks = nil }), "want 3"},
		{"bad chunk digest", edit(func(x *Index) { x.Chunks[1] = "sha256:xyz" }), "chunk 1"},
		{"empty chunk digest", edit(func(x *Index) { x.Chunks[2] = "" }), "chunk 2"},
		{"chunks not strings", strings.Replace(encode(good), `"chunks":[`, `"chunks":[1,`, 1), "not valid JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.json))
			testenv.WantError(t, err, errdefs.Invalid, api.CodeInvalidChunkIndex)
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

func TestParseIndexEmptyBlob(t *testing.T) {
	sum := sha256.Sum256(nil)
	x, err := Parse([]byte(`{"media_type":"` + MediaType + `","digest":"sha256:` + hex.EncodeToString(sum[:]) + `","size":0,"chunk_size":1048576,"chunks":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	if x.Size != 0 || len(x.Chunks) != 0 {
		t.Errorf("index %+v", x)
	}
}

// FuzzParseIndex: Parse never panics, and what it accepts encodes
// back to an index it accepts as equal.
func FuzzParseIndex(f *testing.F) {
	good, err := Build(bytes.NewReader(testenv.RandBytes(3, 9000)), 9000, 4096)
	if err != nil {
		f.Fatal(err)
	}
	b, _ := json.Marshal(good)
	f.Add(b)
	f.Add([]byte(`{"media_type":"` + MediaType + `","size":-1}`))
	f.Add([]byte(`{"chunk_size":9223372036854775807,"size":9223372036854775807}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		x, err := Parse(b)
		if err != nil {
			return
		}
		again, err := json.Marshal(x)
		if err != nil {
			t.Fatal(err)
		}
		y, err := Parse(again)
		if err != nil || !x.Equal(y) {
			t.Fatalf("re-encoded index: %+v, %v; want %+v", y, err, x)
		}
	})
}
