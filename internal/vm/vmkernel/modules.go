package vmkernel

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"path"
	"strings"
)

// GuestModules are the modules the guest loads, in an order that already
// satisfies their hard dependencies (the closure of each module's
// depends= is added before it). crc32c_generic is listed for libcrc32c,
// which only asks for "crc32c" at run time; without it erofs fails to load
// (ext4's metadata checksums use it too). ext4 (with jbd2, mbcache and
// crc16) is the file system of a VM's writable upper disk; the guest
// loads it only for such a disk (vminit.UpperModules).
var GuestModules = []string{
	"virtio_ring", "virtio", "virtio_mmio", "virtio_pci", "virtio_blk", "virtio_console", "virtio_net",
	"crc32c_generic", "libcrc32c", "erofs", "overlay", "ext4",
}

// modInfo is what the build needs from a module's .modinfo section.
type modInfo struct {
	name    string
	depends []string
}

// moduleName is the module name a .ko file path gives ("fs/erofs/erofs.ko.xz"
// gives "erofs"; '-' reads as '_', as the kernel does).
func moduleName(p string) string {
	base := path.Base(p)
	base, _, _ = strings.Cut(base, ".ko")
	return strings.ReplaceAll(base, "-", "_")
}

// isModule reports whether a package path is a kernel module, possibly
// compressed.
func isModule(p string) bool {
	for _, ext := range []string{".ko", ".ko.xz", ".ko.zst"} {
		if strings.HasSuffix(p, ext) {
			return true
		}
	}
	return false
}

// readModInfo parses the name= and depends= fields of an uncompressed
// module's .modinfo section.
func readModInfo(ko []byte) (modInfo, error) {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return modInfo{}, err
	}
	s := f.Section(".modinfo")
	if s == nil {
		return modInfo{}, fmt.Errorf("no .modinfo section")
	}
	data, err := s.Data()
	if err != nil {
		return modInfo{}, err
	}
	var mi modInfo
	for _, kv := range bytes.Split(data, []byte{0}) {
		k, v, _ := strings.Cut(string(kv), "=")
		switch k {
		case "name":
			mi.name = v
		case "depends":
			for _, d := range strings.Split(v, ",") {
				if d != "" {
					mi.depends = append(mi.depends, strings.ReplaceAll(d, "-", "_"))
				}
			}
		}
	}
	return mi, nil
}

// loadOrder returns want and the modules they depend on, each after its
// dependencies and otherwise in want's order. Modules in builtin are
// part of the kernel and left out; a module that is neither in mods nor
// built in is an error.
func loadOrder(want []string, mods map[string]modInfo, builtin map[string]bool) ([]string, error) {
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name, from string) error
	visit = func(name, from string) error {
		switch {
		case state[name] == 2 || builtin[name]:
			return nil
		case state[name] == 1:
			return fmt.Errorf("module dependency cycle through %s", name)
		}
		mi, ok := mods[name]
		if !ok {
			if from != "" {
				return fmt.Errorf("module %s (needed by %s) is not in the kernel package", name, from)
			}
			return fmt.Errorf("module %s is not in the kernel package", name)
		}
		state[name] = 1
		for _, d := range mi.depends {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, name)
		return nil
	}
	for _, name := range want {
		if err := visit(name, ""); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// sigMagic ends a signed module: its PKCS#7 signature, then a
// struct module_signature (12 bytes, the signature's length big-endian
// in its last 4), then this string.
const sigMagic = "~Module signature appended~\n"

// stripSignature returns ko without its appended signature (ko itself if
// it has none or the trailer does not parse). The guest kernel then loads
// it unverified, as its configuration allows (Debian's kernel does not
// force signatures; the kernel notes an unsigned module with a taint flag):
// under TCG, hashing and checking a module's signature costs about as
// much as the rest of its loading (~100 ms of a boot for the modules of
// GuestModules, ~120 ms more for ext4's).
func stripSignature(ko []byte) []byte {
	n := len(ko) - len(sigMagic)
	if n < 12 || string(ko[n:]) != sigMagic {
		return ko
	}
	sigLen := int(binary.BigEndian.Uint32(ko[n-4 : n]))
	end := n - 12 - sigLen
	if sigLen <= 0 || end <= 0 {
		return ko
	}
	return ko[:end]
}
