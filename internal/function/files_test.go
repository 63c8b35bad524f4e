package function

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/google/go-cmp/cmp"
)

func TestFilesErrorCodes(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	fs := create(t, rt, nil).Files()
	ctx := context.Background()
	write := func(p string) {
		t.Helper()
		if _, err := fs.Write(ctx, p, strings.NewReader("x"), sandbox.WriteOptions{Parents: true}); err != nil {
			t.Fatal(err)
		}
	}
	write("/workspace/d/f")
	tests := []struct {
		name  string
		op    func() error
		class errdefs.Class
		code  string
	}{
		{"open missing", func() error { _, _, err := fs.Open(ctx, "nope"); return err }, errdefs.NotFound, "file_not_found"},
		{"open dir", func() error { _, _, err := fs.Open(ctx, "d"); return err }, errdefs.Invalid, "is_a_directory"},
		{"write over dir", func() error {
			_, err := fs.Write(ctx, "d", strings.NewReader("x"), sandbox.WriteOptions{})
			return err
		}, errdefs.Invalid, "is_a_directory"},
		{"write root", func() error {
			_, err := fs.Write(ctx, "/workspace", strings.NewReader("x"), sandbox.WriteOptions{})
			return err
		}, errdefs.Invalid, "is_a_directory"},
		{"write without parent", func() error {
			_, err := fs.Write(ctx, "x/y", strings.NewReader("x"), sandbox.WriteOptions{})
			return err
		}, errdefs.NotFound, "parent_not_found"},
		{"write past MaxBytes", func() error {
			_, err := fs.Write(ctx, "big", strings.NewReader("12345"), sandbox.WriteOptions{MaxBytes: 4})
			return err
		}, errdefs.TooLarge, "file_too_large"},
		{"mkdir existing", func() error { _, err := fs.Mkdir(ctx, "d", false); return err }, errdefs.Conflict, "file_exists"},
		{"mkdir without parent", func() error { _, err := fs.Mkdir(ctx, "a/b", false); return err }, errdefs.NotFound, "file_not_found"},
		{"remove non-empty", func() error { return fs.Remove(ctx, "d", false) }, errdefs.Conflict, "directory_not_empty"},
		{"remove missing", func() error { return fs.Remove(ctx, "nope", true) }, errdefs.NotFound, "file_not_found"},
		{"remove root", func() error { return fs.Remove(ctx, "/workspace", true) }, errdefs.Invalid, "path_is_root"},
		{"rename missing", func() error { _, err := fs.Rename(ctx, "nope", "x"); return err }, errdefs.NotFound, "file_not_found"},
		{"list a file", func() error { _, err := fs.List(ctx, "d/f", 1); return err }, errdefs.Invalid, "not_a_directory"},
		{"outside", func() error { _, err := fs.Stat(ctx, "/etc"); return err }, errdefs.Invalid, "path_outside_root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.op()
			if errdefs.ClassOf(err) != tt.class || errdefs.CodeOf(err) != tt.code {
				t.Errorf("err = %v (%s, %s), want %s, %s", err, errdefs.ClassOf(err), errdefs.CodeOf(err), tt.class, tt.code)
			}
		})
	}
	list, err := fs.List(ctx, "/workspace", 5)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, fi := range list {
		got = append(got, fi.Path)
	}
	if diff := cmp.Diff([]string{"/workspace/d", "/workspace/d/f"}, got); diff != "" {
		t.Errorf("List left temporary files or is unsorted (-want +got):\n%s", diff)
	}
}

func TestFilesListDepthCap(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	fs := create(t, rt, nil).Files()
	ctx := context.Background()
	p := "/workspace"
	for i := 0; i < maxListDepth+3; i++ {
		p += fmt.Sprintf("/%d", i)
	}
	if _, err := fs.Mkdir(ctx, p, true); err != nil {
		t.Fatal(err)
	}
	list, err := fs.List(ctx, "/workspace", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != maxListDepth {
		t.Errorf("List(depth 1000) returned %d entries, want %d", len(list), maxListDepth)
	}
	if list[0].Type != api.FileTypeDir || list[0].Path != "/workspace/0" || list[0].Name != "0" {
		t.Errorf("first entry %+v", list[0])
	}
}
