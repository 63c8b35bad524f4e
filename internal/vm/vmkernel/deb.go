package vmkernel

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path"
	"strings"
)

// kernelFiles is what the guest needs from a linux-image package.
type kernelFiles struct {
	release string            // lib/modules/<release>
	bzImage []byte            // boot/vmlinuz-<release>
	order   []string          // modules to load, dependencies first
	modules map[string][]byte // name → uncompressed .ko, for order
}

// maxModule bounds one module's size; the largest in Debian 6.1 is ~10 MiB.
const maxModule = 64 << 20

// extract reads the kernel and the modules of want (with their
// dependencies) from the .deb at deb. The package's file tree comes from
// `dpkg-deb --fsys-tarfile` (native xz, ~2 s for the 70 MB package,
// against ~20 s decoding xz in Go) and is read in Go; nothing else of the
// package is written out. Every module's .modinfo is read to resolve
// dependencies, so a second pass is needed only when a dependency sorts
// before the module needing it and was not kept.
func extract(ctx context.Context, deb string, want []string) (kernelFiles, error) {
	kf := kernelFiles{modules: map[string][]byte{}}
	infos := map[string]modInfo{}
	paths := map[string]string{}
	builtin := map[string]bool{}
	keep := map[string]bool{}
	for _, w := range want {
		keep[w] = true
	}
	err := walkDeb(ctx, deb, func(name string, r io.Reader) error {
		switch {
		case strings.HasPrefix(name, "boot/vmlinuz-"):
			b, err := io.ReadAll(io.LimitReader(r, maxVmlinux))
			kf.bzImage = b
			if kf.release == "" {
				kf.release = strings.TrimPrefix(name, "boot/vmlinuz-")
			}
			return err
		case strings.HasPrefix(name, "lib/modules/") && path.Base(name) == "modules.builtin":
			b, err := io.ReadAll(io.LimitReader(r, 1<<20))
			for _, l := range strings.Fields(string(b)) {
				builtin[moduleName(l)] = true
			}
			return err
		case strings.HasPrefix(name, "lib/modules/") && isModule(name):
			ko, err := readModule(name, r)
			if err != nil {
				return err
			}
			mi, err := readModInfo(ko)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if mi.name == "" {
				mi.name = moduleName(name)
			}
			infos[mi.name], paths[mi.name] = mi, name
			if keep[mi.name] {
				kf.modules[mi.name] = ko
				for _, d := range mi.depends {
					keep[d] = true
				}
			}
		}
		return nil
	})
	if err != nil {
		return kf, err
	}
	if kf.bzImage == nil {
		return kf, errors.New("no boot/vmlinuz-* in the package")
	}
	if kf.order, err = loadOrder(want, infos, builtin); err != nil {
		return kf, err
	}
	missing := map[string]string{}
	for _, m := range kf.order {
		if kf.modules[m] == nil {
			missing[paths[m]] = m
		}
	}
	if len(missing) > 0 {
		err = walkDeb(ctx, deb, func(name string, r io.Reader) error {
			if m, ok := missing[name]; ok {
				ko, err := readModule(name, r)
				kf.modules[m] = ko
				return err
			}
			return nil
		})
	}
	for m := range kf.modules {
		if !contains(kf.order, m) {
			delete(kf.modules, m)
		}
	}
	return kf, err
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// readModule reads a module file and decompresses it if it is a .ko.xz or
// .ko.zst: the initramfs holds plain modules, which finit_module loads on
// any kernel (compressed ones need CONFIG_MODULE_DECOMPRESS and a flag).
func readModule(name string, r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxModule+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxModule {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, maxModule)
	}
	switch {
	case strings.HasSuffix(name, ".xz"):
		b, err = unxzKernel(b, -1)
	case strings.HasSuffix(name, ".zst"):
		b, err = unzstd(b, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return b, nil
}

// walkDeb calls fn for each regular file of the .deb's data archive, with
// its path relative to / ("boot/vmlinuz-…").
func walkDeb(ctx context.Context, deb string, fn func(name string, r io.Reader) error) error {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dpkg-deb: %w", err)
	}
	werr := func() error {
		tr := tar.NewReader(out)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if h.Typeflag != tar.TypeReg {
				continue
			}
			if err := fn(strings.TrimPrefix(path.Clean("/"+h.Name), "/"), tr); err != nil {
				return err
			}
		}
	}()
	if werr != nil {
		io.Copy(io.Discard, out) // let dpkg-deb finish writing
	}
	if err := cmd.Wait(); err != nil && werr == nil {
		werr = fmt.Errorf("dpkg-deb --fsys-tarfile: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	if werr != nil {
		return fmt.Errorf("reading %s: %w", path.Base(deb), werr)
	}
	return nil
}
