package vmkernel

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/klauspost/compress/zstd"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Offsets in the x86 boot protocol's setup header
// (Documentation/arch/x86/boot.rst).
const (
	hdrSetupSects    = 0x1f1
	hdrMagic         = 0x202 // "HdrS"
	hdrVersion       = 0x206
	hdrPayloadOffset = 0x248
	hdrPayloadLength = 0x24c
)

// maxVmlinux bounds what a payload may decompress to (its trailer says
// how much it will be); Debian's 6.1 vmlinux is about 60 MiB.
const maxVmlinux = 512 << 20

// Vmlinux returns the uncompressed ELF kernel inside bzImage, the
// payload the kernel's own decompressor would unpack, and the name of its
// compression. QEMU boots the ELF by its PVH entry point, which under TCG
// saves the ~3 s the decompressor takes. Payloads compressed with xz or
// zstd are supported; others return an error wrapping
// errdefs.ErrNotSupported, and so does a kernel built without CONFIG_PVH.
func Vmlinux(bzImage []byte) (vmlinux []byte, compression string, err error) {
	if len(bzImage) < 0x250 || string(bzImage[hdrMagic:hdrMagic+4]) != "HdrS" {
		return nil, "", errors.New("not a bzImage: no HdrS setup header")
	}
	if v := binary.LittleEndian.Uint16(bzImage[hdrVersion:]); v < 0x208 {
		return nil, "", fmt.Errorf("boot protocol %d.%02d has no payload fields: %w", v>>8, v&0xff, errdefs.ErrNotSupported)
	}
	setup := int(bzImage[hdrSetupSects])
	if setup == 0 {
		setup = 4
	}
	start := (setup+1)*512 + int(binary.LittleEndian.Uint32(bzImage[hdrPayloadOffset:]))
	end := start + int(binary.LittleEndian.Uint32(bzImage[hdrPayloadLength:]))
	if start < 0 || end > len(bzImage) || end-start < 8 {
		return nil, "", fmt.Errorf("bzImage payload [%d, %d) outside the file (%d bytes)", start, end, len(bzImage))
	}
	payload := bzImage[start:end]
	// The build appends the decompressed size (32-bit little endian)
	// after the compressed stream.
	size := int(binary.LittleEndian.Uint32(payload[len(payload)-4:]))
	stream := payload[:len(payload)-4]
	if size > maxVmlinux {
		return nil, "", fmt.Errorf("bzImage payload claims %d bytes uncompressed", size)
	}
	var out []byte
	switch {
	case bytes.HasPrefix(stream, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		compression = "xz"
		out, err = unxzKernel(stream, size)
	case bytes.HasPrefix(stream, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		compression = "zstd"
		out, err = unzstd(stream, size)
	default:
		return nil, "", fmt.Errorf("bzImage payload compression (magic % x): %w", stream[:4], errdefs.ErrNotSupported)
	}
	if err != nil {
		return nil, "", fmt.Errorf("decompressing the %s payload: %w", compression, err)
	}
	if len(out) != size {
		return nil, "", fmt.Errorf("%s payload gave %d bytes, its trailer says %d", compression, len(out), size)
	}
	out, err = trimELF(out)
	if err != nil {
		return nil, "", err
	}
	return out, compression, nil
}

func unzstd(stream []byte, size int) ([]byte, error) {
	d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxVmlinux+1))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.DecodeAll(stream, make([]byte, 0, size))
}

// trimELF checks that b is an x86-64 ELF kernel with a PVH entry point
// (the Xen PHYS32_ENTRY note) and returns it without what follows the
// ELF file: the build appends the relocation table the decompressor uses,
// which a PVH boot does not need.
func trimELF(b []byte) ([]byte, error) {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("payload is not an ELF kernel: %w", err)
	}
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 {
		return nil, fmt.Errorf("payload is a %s %s ELF, want x86-64: %w", f.Class, f.Machine, errdefs.ErrNotSupported)
	}
	var end uint64
	grow := func(e uint64) {
		if e > end {
			end = e
		}
	}
	for _, p := range f.Progs {
		grow(p.Off + p.Filesz)
	}
	pvh := false
	for _, s := range f.Sections {
		if s.Type != elf.SHT_NOBITS {
			grow(s.Offset + s.FileSize)
		}
		if s.Type == elf.SHT_NOTE && !pvh {
			data, err := s.Data()
			if err != nil {
				return nil, fmt.Errorf("reading ELF notes %s: %w", s.Name, err)
			}
			pvh = hasPVHNote(data, f.ByteOrder)
		}
	}
	hdr := b[0x28:] // e_shoff (8), then flags, ehsize, phentsize, phnum, shentsize (2), shnum (2)
	shoff := f.ByteOrder.Uint64(hdr)
	grow(shoff + uint64(f.ByteOrder.Uint16(hdr[0x3a-0x28:]))*uint64(f.ByteOrder.Uint16(hdr[0x3c-0x28:])))
	if !pvh {
		return nil, fmt.Errorf("kernel has no PVH entry point (CONFIG_PVH): %w", errdefs.ErrNotSupported)
	}
	if end > uint64(len(b)) {
		return nil, fmt.Errorf("ELF kernel extends to %d bytes, payload has %d", end, len(b))
	}
	return b[:end], nil
}

// xenElfnotePhys32Entry is XEN_ELFNOTE_PHYS32_ENTRY, the note a PVH boot
// enters the kernel by.
const xenElfnotePhys32Entry = 18

// hasPVHNote reports whether the note section data holds a "Xen"
// PHYS32_ENTRY note.
func hasPVHNote(data []byte, bo binary.ByteOrder) bool {
	for len(data) >= 12 {
		namesz, descsz, typ := bo.Uint32(data), bo.Uint32(data[4:]), bo.Uint32(data[8:])
		n := 12 + align4(namesz) + align4(descsz)
		if n > uint64(len(data)) {
			return false
		}
		name := data[12 : 12+namesz]
		if typ == xenElfnotePhys32Entry && string(bytes.TrimRight(name, "\x00")) == "Xen" {
			return true
		}
		data = data[n:]
	}
	return false
}

func align4(n uint32) uint64 { return (uint64(n) + 3) &^ 3 }
