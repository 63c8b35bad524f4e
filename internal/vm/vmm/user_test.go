package vmm

import (
	"slices"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// TestPassFilesArgs: with PassFiles the command line names the kernel,
// initrd and disks by the descriptors Start passes (3 on, in that order),
// never by their host paths.
func TestPassFilesArgs(t *testing.T) {
	c := Config{
		Machine: Q35, CPUs: 1, MemoryMiB: 256, RunDir: "/run/x",
		Kernel: "/k/vmlinux", Initrd: "/k/initrd",
		Disks:     []Disk{{Path: "/l/a", Serial: "a"}, {Path: "/l/b", Serial: "b"}},
		Writable:  &Disk{Path: "/w/rw"},
		PassFiles: true,
		User:      &User{UID: 1065536, GID: 1065536},
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	args := strings.Join(c.Args(), " ")
	for _, want := range []string{
		"-kernel /proc/self/fd/3", "-initrd /proc/self/fd/4",
		"file=/proc/self/fd/5,", "file=/proc/self/fd/6,", "id=rw0,file=/proc/self/fd/7,",
		"virtio-blk-pci,drive=ro0,serial=a",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("args lack %q:\n%s", want, args)
		}
	}
	for _, p := range []string{"/k/", "/l/", "/w/"} {
		if strings.Contains(args, p) {
			t.Errorf("args name host path %s:\n%s", p, args)
		}
	}
	paths, write := c.passedFiles()
	if !slices.Equal(paths, []string{"/k/vmlinux", "/k/initrd", "/l/a", "/l/b", "/w/rw"}) || !slices.Equal(write, []bool{false, false, false, false, true}) {
		t.Errorf("passed files %v %v", paths, write)
	}
}

func TestUserNotRoot(t *testing.T) {
	for _, u := range []User{{UID: 0, GID: 5}, {UID: 5, GID: 0}} {
		c := Config{Machine: MicroVM, CPUs: 1, MemoryMiB: 256, RunDir: "/run/x", Kernel: "/k", User: &u}
		if err := c.Validate(); errdefs.CodeOf(err) != CodeInvalidConfig {
			t.Errorf("user %+v: %v, want %s", u, err, CodeInvalidConfig)
		}
	}
}
