package vmkernel

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dsec-dev/dsec/internal/sys"
)

// maxKernelFile bounds the kernel file read from an image.
const maxKernelFile = 256 << 20

// FromTree returns the guest kernel an image brings: root is the image's
// merged file tree, and it holds one /boot/vmlinuz-<release> (the last by
// name if several) with a /lib/modules/<release>/ directory. found is
// false, with no error, when it has none. The kernel is converted as
// Fetch converts a package's (a bzImage becomes a PVH vmlinux; an ELF
// vmlinux is kept; a bzImage that cannot be converted is kept as is, which
// the vm tier's firmware boots), and GuestModules with their dependencies
// are taken from the release's modules (modules.builtin honoured). The
// entry is cached under cacheDir/kernel/r<recipe>/img-<sha256 of the
// kernel file> like a package's, so the next call only checks it.
func FromTree(ctx context.Context, cacheDir, rootDir string) (k Kernel, found bool, err error) {
	// The tree is the image's: every path is resolved inside it (a
	// symbolic link out of it fails), never on the host.
	root, err := os.OpenRoot(rootDir)
	if err != nil {
		return Kernel{}, false, err
	}
	defer root.Close()
	kpath, release, ok := treeKernel(root)
	if !ok {
		return Kernel{}, false, nil
	}
	raw, err := readCapped(root, kpath, maxKernelFile)
	if err != nil {
		return Kernel{}, true, err
	}
	sum := sha256.Sum256(raw)
	key := "img-" + hex.EncodeToString(sum[:])
	dir := filepath.Join(cacheDir, "kernel", "r"+fmt.Sprint(recipe), key)
	if k, err := loadKernel(dir); err == nil {
		return k, true, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return Kernel{}, true, err
	}
	unlock, err := sys.LockFile(ctx, filepath.Join(cacheDir, "kernel.lock"))
	if err != nil {
		return Kernel{}, true, fmt.Errorf("locking the kernel cache: %w", err)
	}
	defer unlock()
	if k, err := loadKernel(dir); err == nil {
		return k, true, nil
	}
	vmlinux, compression := raw, "none"
	if !bytes.HasPrefix(raw, []byte("\x7fELF")) {
		if v, c, err := Vmlinux(raw); err == nil {
			vmlinux, compression = v, c
		} else {
			compression = "bzImage" // booted as is, through the firmware
		}
	}
	mods, order, err := treeModules(root, path.Join("lib/modules", release))
	if err != nil {
		return Kernel{}, true, fmt.Errorf("the image's modules of %s: %w", release, err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".tmp-")
	if err != nil {
		return Kernel{}, true, err
	}
	defer os.RemoveAll(tmp)
	m := Manifest{Recipe: recipe, Package: "image:" + filepath.Base(kpath), Release: release, DebSHA256: key, Compression: compression}
	if err := os.Mkdir(filepath.Join(tmp, "modules"), 0o755); err != nil {
		return Kernel{}, true, err
	}
	if m.Vmlinux, err = writeFile(tmp, "vmlinux", vmlinux); err != nil {
		return Kernel{}, true, err
	}
	for _, name := range order {
		f, err := writeFile(tmp, filepath.Join("modules", name+".ko"), mods[name])
		if err != nil {
			return Kernel{}, true, err
		}
		m.Modules = append(m.Modules, Module{Name: name, File: f})
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Kernel{}, true, err
	}
	if _, err := writeFile(tmp, "manifest.json", append(b, '\n')); err != nil {
		return Kernel{}, true, err
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return Kernel{}, true, err
	}
	return Kernel{Dir: dir, Manifest: m}, true, nil
}

// treeKernel finds boot/vmlinuz-<release> with its lib/modules/<release>
// directory in root.
func treeKernel(root *os.Root) (kpath, release string, ok bool) {
	ks, _ := fs.Glob(root.FS(), "boot/vmlinuz-*")
	slices.Sort(ks)
	for i := len(ks) - 1; i >= 0; i-- {
		r := strings.TrimPrefix(path.Base(ks[i]), "vmlinuz-")
		if r == "" || r == "." || r == ".." {
			continue
		}
		if fi, err := root.Stat(path.Join("lib/modules", r)); err == nil && fi.IsDir() {
			if fi, err := root.Stat(ks[i]); err == nil && fi.Mode().IsRegular() {
				return ks[i], r, true
			}
		}
	}
	return "", "", false
}

// treeModules reads GuestModules and their dependencies from a
// /lib/modules/<release> directory, in load order. Dependencies come from
// its modules.dep (depmod's, present on installed systems) or, without
// one, from every module's .modinfo.
func treeModules(root *os.Root, dir string) (map[string][]byte, []string, error) {
	builtin := map[string]bool{}
	if b, err := readCapped(root, path.Join(dir, "modules.builtin"), 1<<20); err == nil {
		for _, l := range strings.Fields(string(b)) {
			builtin[moduleName(l)] = true
		}
	}
	infos := map[string]modInfo{}
	paths := map[string]string{}
	if b, err := readCapped(root, path.Join(dir, "modules.dep"), 16<<20); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			p, deps, ok := strings.Cut(l, ":")
			if !ok || !isModule(p) || !fs.ValidPath(p) {
				continue
			}
			mi := modInfo{name: moduleName(p)}
			for _, d := range strings.Fields(deps) {
				mi.depends = append(mi.depends, moduleName(d))
			}
			infos[mi.name], paths[mi.name] = mi, path.Join(dir, p)
		}
	} else {
		err := fs.WalkDir(root.FS(), dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !isModule(p) || !d.Type().IsRegular() {
				return err
			}
			ko, err := readModuleFile(root, p)
			if err != nil {
				return err
			}
			mi, err := readModInfo(ko)
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			if mi.name == "" {
				mi.name = moduleName(p)
			}
			infos[mi.name], paths[mi.name] = mi, p
			return nil
		})
		if err != nil {
			return nil, nil, err
		}
	}
	order, err := loadOrder(GuestModules, infos, builtin)
	if err != nil {
		return nil, nil, err
	}
	kos := map[string][]byte{}
	for _, m := range order {
		if kos[m], err = readModuleFile(root, paths[m]); err != nil {
			return nil, nil, err
		}
	}
	return kos, order, nil
}

// readModuleFile reads a module file in root, decompressed (readModule).
func readModuleFile(root *os.Root, p string) ([]byte, error) {
	f, err := root.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readModule(p, f)
}

// readCapped reads a regular file of root of at most max bytes.
func readCapped(root *os.Root, p string, max int64) ([]byte, error) {
	f, err := root.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", p)
	}
	if fi.Size() > max {
		return nil, fmt.Errorf("%s: larger than %d bytes", p, max)
	}
	b := make([]byte, fi.Size())
	_, err = f.ReadAt(b, 0)
	return b, err
}
