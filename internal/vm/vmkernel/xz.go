package vmkernel

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/crc64"
	"io"

	"github.com/ulikunitz/xz/lzma"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// unxzKernel decodes an xz stream as the kernel build writes it
// (`xz --check=crc32 --x86 --lzma2=,dict=32MiB`): one block whose filters
// are an optional x86 BCJ filter and LZMA2. github.com/ulikunitz/xz
// decodes LZMA2 but not BCJ filters, so the container is parsed here and
// the x86 filter undone after LZMA2. The block's check is verified on the
// result. A size < 0 takes the size from the stream's index.
func unxzKernel(s []byte, size int) ([]byte, error) {
	if len(s) < 24 || !bytes.HasPrefix(s, []byte{0xfd, '7', 'z', 'X', 'Z', 0}) || string(s[len(s)-2:]) != "YZ" {
		return nil, errors.New("not a single xz stream")
	}
	checkType := s[7] & 0x0f
	checkSize := map[byte]int{0: 0, 1: 4, 4: 8}[checkType]
	if checkType != 0 && checkSize == 0 {
		return nil, fmt.Errorf("xz check type %d: %w", checkType, errdefs.ErrNotSupported)
	}

	// The index (located by the footer) gives the block's size.
	footer := s[len(s)-12:]
	indexSize := (int(binary.LittleEndian.Uint32(footer[4:])) + 1) * 4
	indexAt := len(s) - 12 - indexSize
	if indexAt < 12 {
		return nil, errors.New("xz index outside the stream")
	}
	idx := s[indexAt:]
	if idx[0] != 0 {
		return nil, errors.New("bad xz index indicator")
	}
	idx = idx[1:]
	records, idx := uvarint(idx)
	if records != 1 {
		return nil, fmt.Errorf("xz stream with %d blocks: %w", records, errdefs.ErrNotSupported)
	}
	unpadded, idx := uvarint(idx)
	uncompressed, _ := uvarint(idx)
	if size < 0 {
		size = int(min(uncompressed, maxVmlinux))
	} else if uncompressed != uint64(size) {
		return nil, fmt.Errorf("xz index says %d bytes uncompressed, the kernel's trailer %d", uncompressed, size)
	}

	// Block header: size, flags, optional sizes, filter flags.
	block := s[12:]
	hdrSize := (int(block[0]) + 1) * 4
	if hdrSize > len(block) || uint64(hdrSize+checkSize) > unpadded || unpadded > uint64(indexAt-12) {
		return nil, errors.New("xz block header out of range")
	}
	hdr := block[1:hdrSize]
	flags := hdr[0]
	hdr = hdr[1:]
	if flags&0x40 != 0 {
		_, hdr = uvarint(hdr)
	}
	if flags&0x80 != 0 {
		_, hdr = uvarint(hdr)
	}
	bcj, dict := false, 0
	for i := 0; i <= int(flags&3); i++ {
		var id, n uint64
		id, hdr = uvarint(hdr)
		n, hdr = uvarint(hdr)
		if n > uint64(len(hdr)) {
			return nil, errors.New("xz filter properties out of range")
		}
		props := hdr[:n]
		hdr = hdr[n:]
		switch {
		case id == 0x04 && i == 0 && len(props) == 0: // x86 BCJ, start offset 0
			bcj = true
		case id == 0x21 && i == int(flags&3) && len(props) == 1: // LZMA2, last
			bits := props[0] & 0x3f
			if bits > 40 {
				return nil, errors.New("bad LZMA2 dictionary size")
			}
			dict = 2 | int(bits&1)
			dict <<= bits/2 + 11
			if bits == 40 {
				dict = 0xffffffff
			}
		default:
			return nil, fmt.Errorf("xz filter %#x: %w", id, errdefs.ErrNotSupported)
		}
	}
	if dict == 0 {
		return nil, errors.New("xz block without LZMA2")
	}
	data := block[hdrSize : int(unpadded)-checkSize]
	check := block[(int(unpadded)+3)&^3-checkSize:][:checkSize]

	r, err := lzma.Reader2Config{DictCap: max(dict, lzma.MinDictCap)}.NewReader2(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	out := bytes.NewBuffer(make([]byte, 0, size))
	if _, err := io.Copy(out, io.LimitReader(r, int64(size)+1)); err != nil {
		return nil, fmt.Errorf("LZMA2: %w", err)
	}
	b := out.Bytes()
	if bcj {
		unBCJx86(b)
	}
	switch checkType {
	case 1:
		if crc32.ChecksumIEEE(b) != binary.LittleEndian.Uint32(check) {
			return nil, errors.New("xz CRC32 mismatch")
		}
	case 4:
		if crc64.Checksum(b, crc64.MakeTable(crc64.ECMA)) != binary.LittleEndian.Uint64(check) {
			return nil, errors.New("xz CRC64 mismatch")
		}
	}
	return b, nil
}

// uvarint reads an xz multibyte integer (LEB128); a malformed one reads as
// an impossible size, which the callers' range checks reject.
func uvarint(b []byte) (uint64, []byte) {
	v, n := binary.Uvarint(b)
	if n <= 0 {
		return 1<<63 - 1, nil
	}
	return v, b[n:]
}

// unBCJx86 undoes xz's x86 branch/call/jump filter over a whole buffer
// that starts at stream offset 0 (xz-embedded's bcj_x86).
func unBCJx86(buf []byte) {
	maskToAllowed := [8]bool{true, true, true, false, true, false, false, false}
	maskToBitNum := [8]uint32{0, 1, 2, 2, 3, 3, 3, 3}
	msbyte := func(b byte) bool { return b == 0x00 || b == 0xff }
	if len(buf) <= 4 {
		return
	}
	size := len(buf) - 4
	prevPos := -1
	var prevMask uint32
	for i := 0; i < size; i++ {
		if buf[i]&0xfe != 0xe8 {
			continue
		}
		d := i - prevPos
		if d > 3 {
			prevMask = 0
		} else {
			prevMask = (prevMask << (d - 1)) & 7
			if prevMask != 0 {
				b := buf[i+4-int(maskToBitNum[prevMask])]
				if !maskToAllowed[prevMask] || msbyte(b) {
					prevPos = i
					prevMask = prevMask<<1 | 1
					continue
				}
			}
		}
		prevPos = i
		if !msbyte(buf[i+4]) {
			prevMask = prevMask<<1 | 1
			continue
		}
		src := binary.LittleEndian.Uint32(buf[i+1:])
		var dest uint32
		for {
			dest = src - uint32(i+5)
			if prevMask == 0 {
				break
			}
			j := maskToBitNum[prevMask] * 8
			if !msbyte(byte(dest >> (24 - j))) {
				break
			}
			src = dest ^ (1<<(32-j) - 1)
		}
		dest &= 0x01ffffff
		dest |= -(dest & 0x01000000)
		binary.LittleEndian.PutUint32(buf[i+1:], dest)
		i += 4
	}
}
