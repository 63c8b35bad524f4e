// Package vmkernel provides the guest kernel and initramfs of the microVM
// tiers. Fetch takes Debian's linux-image package from the host's package
// mirror (apt-get download; the package named by linux-image-amd64's
// candidate), turns its compressed bzImage into the uncompressed ELF
// vmlinux that QEMU boots through the PVH entry point, and keeps the
// modules of GuestModules with their dependencies, without their
// signatures. Initramfs packs those
// modules and the guest agent (as /init, run in internal/guest/vminit's mode)
// into a reproducible gzip newc archive. Both are cached under a cache
// directory by digest: the kernel by the .deb's SHA-256, the initramfs by
// the digest of its inputs.
package vmkernel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/dsec-dev/dsec/internal/sys"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// recipe is the version of what Fetch makes of a package; a change to
// the conversion or the module set bumps it. Entries of recipe 2 on live
// under kernel/r<recipe>/, so nodes (and test runs) of different recipes
// sharing one cache directory do not replace each other's entries; older
// ones are ignored. Recipe 3 adds ext4 (the upper disk's file system)
// and strips the modules' signatures (stripSignature).
const recipe = 3

// Kernel is a cached guest kernel. It is a value; the files it names are
// never modified once cached.
type Kernel struct {
	// Dir is the cache entry: vmlinux, modules/<name>.ko, manifest.json.
	Dir string
	Manifest
}

// Manifest describes a cached kernel (Dir/manifest.json).
type Manifest struct {
	Recipe    int    `json:"recipe"`
	Package   string `json:"package"`    // linux-image-6.1.0-57-amd64
	Version   string `json:"version"`    // 6.1.192-3
	Release   string `json:"release"`    // 6.1.0-57-amd64 (uname -r)
	DebSHA256 string `json:"deb_sha256"` // the package's digest: the cache key
	// Compression is the bzImage payload's ("xz", "zstd").
	Compression string `json:"compression"`
	Vmlinux     File   `json:"vmlinux"`
	// Modules are in load order: each after its dependencies.
	Modules []Module `json:"modules"`
}

// File is a file of a cache entry, relative to its Dir.
type File struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Module is a kernel module of a cached kernel.
type Module struct {
	Name string `json:"name"`
	File
}

// VmlinuxPath is the ELF kernel QEMU boots with -kernel.
func (k Kernel) VmlinuxPath() string { return filepath.Join(k.Dir, k.Vmlinux.Path) }

// Fetch returns the guest kernel of the package the host's apt index
// currently names, from the cache in cacheDir/kernel/r<recipe>/<deb sha256> if it is
// there and intact, else downloaded (refreshing the apt index once if the
// package cannot be found or fetched), converted and cached. The lookup
// reads only the local apt index, so a cached kernel needs no network.
// Concurrent calls, in this or other processes, take turns through a lock
// file; entries appear by rename, whole. Errors wrap
// errdefs.ErrNotSupported when the host has no apt or the kernel cannot be
// booted as a PVH vmlinux.
func Fetch(ctx context.Context, cacheDir string, log *slog.Logger) (Kernel, error) {
	pkg, err := resolveRecent(ctx)
	updated := false
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Info("refreshing the apt index to find the guest kernel", "err", err)
		if uerr := aptUpdate(ctx); uerr != nil {
			return Kernel{}, fmt.Errorf("finding the guest kernel: %w (apt-get update: %v)", err, uerr)
		}
		updated = true
		pkg, err = resolve(ctx)
	}
	if err != nil {
		return Kernel{}, fmt.Errorf("finding the guest kernel: %w", err)
	}
	dir := filepath.Join(cacheDir, "kernel", "r"+strconv.Itoa(recipe), pkg.SHA256)
	if k, err := loadKernel(dir); err == nil {
		return k, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return Kernel{}, err
	}
	unlock, err := sys.LockFile(ctx, filepath.Join(cacheDir, "kernel.lock"))
	if err != nil {
		return Kernel{}, fmt.Errorf("locking the kernel cache: %w", err)
	}
	defer unlock()
	if k, err := loadKernel(dir); err == nil {
		return k, nil // another caller cached it meanwhile
	}
	start := time.Now()
	log.Info("fetching the guest kernel from the apt mirror (once per kernel package)", "package", pkg.Name, "version", pkg.Version)
	k, err := build(ctx, dir, pkg, updated, log)
	if err != nil {
		return Kernel{}, fmt.Errorf("fetching %s %s: %w", pkg.Name, pkg.Version, err)
	}
	log.Info("fetched the guest kernel", "package", pkg.Name, "version", pkg.Version,
		"release", k.Release, "vmlinux_mib", k.Vmlinux.Size>>20, "modules", len(k.Modules), "took", time.Since(start).Round(time.Millisecond))
	return k, nil
}

// build downloads pkg and writes its cache entry dir, through a temporary
// directory beside it renamed into place.
// Preconditions: the kernel cache lock is held.
func build(ctx context.Context, dir string, pkg debPackage, updated bool, log *slog.Logger) (Kernel, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".tmp-")
	if err != nil {
		return Kernel{}, err
	}
	defer os.RemoveAll(tmp)
	deb, err := download(ctx, tmp, pkg)
	if err != nil && !updated {
		// The index may name a version the mirror has dropped.
		log.Info("refreshing the apt index after a failed download", "err", err)
		if aptUpdate(ctx) == nil {
			if p, rerr := resolve(ctx); rerr == nil && p == pkg {
				deb, err = download(ctx, tmp, pkg)
			} else if rerr == nil {
				return Kernel{}, fmt.Errorf("%w (the apt index now names %s %s; try again)", err, p.Name, p.Version)
			}
		}
	}
	if err != nil {
		return Kernel{}, err
	}
	if sum, err := fileSHA256(deb); err != nil {
		return Kernel{}, err
	} else if sum != pkg.SHA256 {
		return Kernel{}, fmt.Errorf("downloaded package has SHA-256 %s, the apt index says %s", sum, pkg.SHA256)
	}
	kf, err := extract(ctx, deb, GuestModules)
	if err != nil {
		return Kernel{}, err
	}
	if err := os.Remove(deb); err != nil {
		return Kernel{}, err
	}
	vmlinux, compression, err := Vmlinux(kf.bzImage)
	if err != nil {
		return Kernel{}, fmt.Errorf("converting vmlinuz-%s: %w", kf.release, err)
	}
	m := Manifest{Recipe: recipe, Package: pkg.Name, Version: pkg.Version, Release: kf.release,
		DebSHA256: pkg.SHA256, Compression: compression}
	entry := filepath.Join(tmp, "entry")
	if err := os.MkdirAll(filepath.Join(entry, "modules"), 0o755); err != nil {
		return Kernel{}, err
	}
	if m.Vmlinux, err = writeFile(entry, "vmlinux", vmlinux); err != nil {
		return Kernel{}, err
	}
	for _, name := range kf.order {
		f, err := writeFile(entry, filepath.Join("modules", name+".ko"), stripSignature(kf.modules[name]))
		if err != nil {
			return Kernel{}, err
		}
		m.Modules = append(m.Modules, Module{Name: name, File: f})
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Kernel{}, err
	}
	if _, err := writeFile(entry, "manifest.json", append(b, '\n')); err != nil {
		return Kernel{}, err
	}
	os.RemoveAll(dir) // an entry that failed loadKernel
	if err := os.Rename(entry, dir); err != nil {
		return Kernel{}, err
	}
	return Kernel{Dir: dir, Manifest: m}, nil
}

// loadKernel returns the cache entry dir if it is complete and intact:
// its manifest has the current recipe and every file its digest.
func loadKernel(dir string) (Kernel, error) {
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return Kernel{}, err
	}
	k := Kernel{Dir: dir}
	if err := json.Unmarshal(b, &k.Manifest); err != nil {
		return Kernel{}, err
	}
	if k.Recipe != recipe || filepath.Base(dir) != k.DebSHA256 || len(k.Modules) == 0 {
		return Kernel{}, errors.New("stale cache entry")
	}
	files := []File{k.Vmlinux}
	for _, m := range k.Modules {
		files = append(files, m.File)
	}
	for _, f := range files {
		if sum, err := fileSHA256(filepath.Join(dir, f.Path)); err != nil {
			return Kernel{}, err
		} else if sum != f.SHA256 {
			return Kernel{}, fmt.Errorf("%s: digest mismatch", f.Path)
		}
	}
	return k, nil
}

// writeFile writes b to dir/rel (0644) and describes it.
func writeFile(dir, rel string, b []byte) (File, error) {
	sum := sha256.Sum256(b)
	if err := os.WriteFile(filepath.Join(dir, rel), b, 0o644); err != nil {
		return File{}, err
	}
	return File{Path: rel, Size: int64(len(b)), SHA256: hex.EncodeToString(sum[:])}, nil
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
