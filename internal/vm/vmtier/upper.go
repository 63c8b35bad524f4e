package vmtier

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Kinds of upper layer (Options.Upper).
const (
	// UpperDisk gives each VM a writable disk of its Spec.DiskMB with an
	// ext4 file system: the guest's writes land in a sparse file of the
	// host, and a full disk is ENOSPC in the guest.
	UpperDisk = "disk"
	// UpperTmpfs makes the upper a tmpfs of Spec.DiskMB in the guest:
	// what is written counts against the guest's memory.
	UpperTmpfs = "tmpfs"
)

// upperFile is a VM's upper disk in its run directory.
const upperFile = "upper.img"

// upperFormat versions the templates' mkfs options: a change makes new
// templates beside the old ones (cacheDir/upper/ext4-v<format>-<n>m.img).
const upperFormat = 1

// mkfsExt4 is e2fsprogs' ext4 mkfs (Debian: e2fsprogs).
const mkfsExt4 = "mkfs.ext4"

// mkfsArgs format a template: 4 KiB blocks and an inode per 16 KiB
// (mke2fs's "small" type would pick 1 KiB blocks under 512 MiB), no
// reserved blocks (the guest's root would use them anyway), no journal
// (the disk lives as long as its VM; a crashed VM's disk is thrown
// away), inode tables not zeroed (the guest mounts with noinit_itable),
// root owned by root whoever runs mkfs.
var mkfsArgs = []string{"-q", "-F", "-b", "4096", "-i", "16384", "-m", "0", "-O", "^has_journal",
	"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0"}

// upperKind is the runtime's kind of upper: Options.Upper, UpperDisk if
// unset.
func (r *Runtime) upperKind() string {
	if r.opt.Upper == "" {
		return UpperDisk
	}
	return r.opt.Upper
}

// upperTemplate returns an empty ext4 file system of mib MiB in a sparse
// file, made once per size under CacheDir/upper and copied for each VM.
// Concurrent callers may both make it; either file serves.
func (r *Runtime) upperTemplate(ctx context.Context, mib int) (string, error) {
	dir := filepath.Join(r.opt.CacheDir, "upper")
	p := filepath.Join(dir, "ext4-v"+strconv.Itoa(upperFormat)+"-"+strconv.Itoa(mib)+"m.img")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	bin, err := exec.LookPath(mkfsExt4)
	if err != nil {
		return "", errdefs.Wrap(errdefs.Unavailable, api.CodeMkfsMissing, err,
			"the VM's upper disk needs %s (Debian: e2fsprogs), or set [microvm] upper = %q", mkfsExt4, UpperTmpfs)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after the rename, nothing
	err = f.Truncate(int64(mib) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, bin, append(mkfsArgs, tmp)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("formatting the upper disk template: %w: %s", err, strings.TrimSpace(out.String()))
	}
	if err := os.Chmod(tmp, 0o444); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, p); err != nil {
		return "", err
	}
	return p, nil
}

// makeUpper gives the VM of run directory dir its upper disk of mib MiB
// (dir/upperFile, 0600): a copy of the size's template, by reflink where
// the file system has them, else sparse (the template's data is ~250 KiB).
func (r *Runtime) makeUpper(ctx context.Context, dir string, mib int) (string, error) {
	tmpl, err := r.upperTemplate(ctx, mib)
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, upperFile)
	if _, err := sys.CloneFile(p, tmpl, 0o600); err != nil {
		return "", fmt.Errorf("copying the upper disk template: %w", err)
	}
	return p, nil
}
