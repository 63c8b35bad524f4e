package layer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// On-disk EROFS constants (erofs_fs.h).
const (
	erofsSuperOffset  = 1024
	erofsSuperSize    = 128
	erofsMagic        = 0xE0F5E1E2
	erofsDevSlotSize  = 128
	compatSBChecksum  = 0x1
	incompatDeviceTbl = 0x8
	minBlockBits      = 9
	maxBlockBits      = 16
)

// Superblock is the part of an EROFS superblock that layer validation
// reads.
type Superblock struct {
	Checksum        uint32
	FeatureCompat   uint32
	BlockBits       uint8
	RootNID         uint16
	Inodes          uint64
	BuildTime       uint64
	Blocks          uint32
	MetaBlockAddr   uint32
	UUID            [16]byte
	FeatureIncompat uint32
	ExtraDevices    uint16
	DevSlotOffset   uint16 // in units of 128 bytes
	// Devices holds the extra device slots' block counts and mapped
	// block addresses, one per extra device.
	Devices []DeviceSlot
}

// DeviceSlot is one entry of the EROFS device table.
type DeviceSlot struct {
	Blocks        uint32
	MappedBlkAddr uint32
}

// BlockSize is the image's block size in bytes.
func (s Superblock) BlockSize() int { return 1 << s.BlockBits }

var errSuperblock = errors.New("bad erofs superblock")

// ParseSuperblock parses the EROFS superblock and device table from the
// start of an image (at least the first block). It checks the magic, the
// block size, the checksum when the image declares one, and that the
// device table lies inside b.
func ParseSuperblock(b []byte) (Superblock, error) {
	var s Superblock
	if len(b) < erofsSuperOffset+erofsSuperSize {
		return s, fmt.Errorf("%w: image shorter than %d bytes", errSuperblock, erofsSuperOffset+erofsSuperSize)
	}
	sb := b[erofsSuperOffset : erofsSuperOffset+erofsSuperSize]
	le := binary.LittleEndian
	if m := le.Uint32(sb[0:]); m != erofsMagic {
		return s, fmt.Errorf("%w: magic %#x, want %#x", errSuperblock, m, uint32(erofsMagic))
	}
	s.Checksum = le.Uint32(sb[4:])
	s.FeatureCompat = le.Uint32(sb[8:])
	s.BlockBits = sb[12]
	s.RootNID = le.Uint16(sb[14:])
	s.Inodes = le.Uint64(sb[16:])
	s.BuildTime = le.Uint64(sb[24:])
	s.Blocks = le.Uint32(sb[36:])
	s.MetaBlockAddr = le.Uint32(sb[40:])
	copy(s.UUID[:], sb[48:64])
	s.FeatureIncompat = le.Uint32(sb[80:])
	s.ExtraDevices = le.Uint16(sb[86:])
	s.DevSlotOffset = le.Uint16(sb[88:])
	if s.BlockBits < minBlockBits || s.BlockBits > maxBlockBits {
		return s, fmt.Errorf("%w: block size bits %d", errSuperblock, s.BlockBits)
	}
	if s.FeatureCompat&compatSBChecksum != 0 {
		end := s.BlockSize()
		if end < erofsSuperOffset+erofsSuperSize || len(b) < end {
			return s, fmt.Errorf("%w: checksummed block exceeds the data", errSuperblock)
		}
		if got := superblockChecksum(b[:end]); got != s.Checksum {
			return s, fmt.Errorf("%w: checksum %#x, want %#x", errSuperblock, got, s.Checksum)
		}
	}
	if s.ExtraDevices == 0 {
		return s, nil
	}
	if s.FeatureIncompat&incompatDeviceTbl == 0 {
		return s, fmt.Errorf("%w: %d extra devices without a device table", errSuperblock, s.ExtraDevices)
	}
	off := int(s.DevSlotOffset) * erofsDevSlotSize
	end := off + int(s.ExtraDevices)*erofsDevSlotSize
	if off < erofsSuperOffset+erofsSuperSize || end > len(b) {
		return s, fmt.Errorf("%w: device table [%d,%d) outside the data", errSuperblock, off, end)
	}
	s.Devices = make([]DeviceSlot, s.ExtraDevices)
	for i := range s.Devices {
		d := b[off+i*erofsDevSlotSize:]
		s.Devices[i] = DeviceSlot{Blocks: le.Uint32(d[64:]), MappedBlkAddr: le.Uint32(d[68:])}
	}
	return s, nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// superblockChecksum is the kernel's crc32c(~0, block from offset 1024
// with the checksum field zeroed), which is the bitwise complement of
// the standard CRC-32C.
func superblockChecksum(block []byte) uint32 {
	sb := append([]byte(nil), block[erofsSuperOffset:]...)
	binary.LittleEndian.PutUint32(sb[4:], 0)
	return ^crc32.Checksum(sb, castagnoli)
}
