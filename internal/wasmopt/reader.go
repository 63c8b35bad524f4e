package wasmopt

import "fmt"

// reader decodes the binary format. Its first error sticks: later reads
// return zero values, so a caller checks err once after a run of reads
// (and in every loop, so that a huge declared count cannot keep it busy).
type reader struct {
	b   []byte // what is left
	err error
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *reader) malformed(format string, args ...any) {
	r.fail(fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...))
}

func (r *reader) unsupported(format string, args ...any) {
	r.fail(fmt.Errorf("%w: "+format, append([]any{ErrUnsupported}, args...)...))
}

func (r *reader) ok() bool { return r.err == nil }

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.malformed("unexpected end")
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) u32() uint32 {
	if r.err != nil {
		return 0
	}
	v, n, err := readU32(r.b)
	if err != nil {
		r.fail(err)
		return 0
	}
	r.b = r.b[n:]
	return v
}

// leb skips a LEB128 number of at most max bytes (signed immediates,
// whose value Meter does not need).
func (r *reader) leb(max int) {
	if r.err != nil {
		return
	}
	for i := 0; i < max && i < len(r.b); i++ {
		if r.b[i]&0x80 == 0 {
			r.b = r.b[i+1:]
			return
		}
	}
	r.malformed("bad LEB128")
}

// s33 reads a signed LEB128 number of at most 33 bits (a block type).
func (r *reader) s33() int64 {
	if r.err != nil {
		return 0
	}
	var v int64
	var shift uint
	for i := 0; i < 5 && i < len(r.b); i++ {
		c := r.b[i]
		v |= int64(c&0x7f) << shift
		shift += 7
		if c&0x80 == 0 {
			if c&0x40 != 0 {
				v |= -1 << shift
			}
			r.b = r.b[i+1:]
			return v
		}
	}
	r.malformed("bad LEB128")
	return 0
}

func (r *reader) bytes(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.malformed("%d bytes overrun their section", n)
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) name() string { return string(r.bytes(uint64(r.u32()))) }

// count reads a vector's length, which cannot exceed the bytes left (every
// element takes at least one).
func (r *reader) count() uint32 {
	n := r.u32()
	if uint64(n) > uint64(len(r.b)) {
		r.malformed("a count of %d overruns its section", n)
		return 0
	}
	return n
}

// valType reads a value type of the features the runtime enables.
func (r *reader) valType() byte {
	t := r.byte()
	switch t {
	case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, refFunc, refExtern:
	default:
		r.unsupported("value type 0x%x", t)
	}
	return t
}

func (r *reader) refType() byte {
	t := r.byte()
	if t != refFunc && t != refExtern {
		r.unsupported("reference type 0x%x", t)
	}
	return t
}

// limits reads the limits of a table or memory: its minimum, and whether
// it has a maximum.
func (r *reader) limits() (min uint64) {
	switch flag := r.byte(); flag {
	case 0:
		return uint64(r.u32())
	case 1:
		min = uint64(r.u32())
		r.u32()
		return min
	default:
		r.unsupported("limits flag 0x%x (shared or 64-bit)", flag)
		return 0
	}
}

// constExpr skips a constant expression, up to and including its end.
func (r *reader) constExpr() {
	for r.ok() {
		switch op := r.byte(); op {
		case 0x0b:
			return
		case 0x41:
			r.leb(5)
		case 0x42:
			r.leb(10)
		case 0x43:
			r.bytes(4)
		case 0x44:
			r.bytes(8)
		case 0x23, 0xd2: // global.get, ref.func
			r.u32()
		case 0xd0: // ref.null
			r.refType()
		case 0xfd: // v128.const
			if sub := r.u32(); sub != 12 {
				r.unsupported("instruction 0xfd %d in a constant expression", sub)
			}
			r.bytes(16)
		default:
			r.unsupported("instruction 0x%x in a constant expression", op)
		}
	}
}

const (
	refFunc   = 0x70
	refExtern = 0x6f
)
