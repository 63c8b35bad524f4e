package wasmopt

import "fmt"

func readU64(b []byte) (uint64, int, error) {
	var v uint64
	for i := 0; i < 10 && i < len(b); i++ {
		v |= uint64(b[i]&0x7f) << (7 * i)
		if b[i]&0x80 == 0 {
			return v, i + 1, nil
		}
	}
	return 0, 0, fmt.Errorf("%w: bad LEB128", ErrMalformed)
}

func readU32(b []byte) (uint32, int, error) {
	v, n, err := readU64(b)
	if err != nil || n > 5 || v > 1<<32-1 {
		return 0, 0, fmt.Errorf("%w: bad u32", ErrMalformed)
	}
	return uint32(v), n, nil
}

func readS32(b []byte) (int32, int, error) {
	var v int64
	var shift uint
	for i := 0; i < 5 && i < len(b); i++ {
		c := b[i]
		v |= int64(c&0x7f) << shift
		shift += 7
		if c&0x80 == 0 {
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			if v < -1<<31 || v > 1<<31-1 {
				return 0, 0, fmt.Errorf("%w: bad s32", ErrMalformed)
			}
			return int32(v), i + 1, nil
		}
	}
	return 0, 0, fmt.Errorf("%w: bad s32", ErrMalformed)
}

func appendU32(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

func appendS32(b []byte, v int32) []byte {
	x := int64(v)
	for {
		c := byte(x & 0x7f)
		x >>= 7
		if (x == 0 && c&0x40 == 0) || (x == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}
