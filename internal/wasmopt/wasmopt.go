// Package wasmopt rewrites WebAssembly modules before compilation.
//
// Meter (meter.go) checks what a module declares against Limits before
// anything else reads it, and rewrites it to charge its call frames and
// table growth to a room the host sets; a module past the room traps or
// fails to grow instead of taking the host's memory.
//
// MergeData merges active data segments, so that instantiating is cheaper
// without changing what the module computes. The Go toolchain emits a
// data segment for every run of non-zero bytes (tens of thousands per module),
// and wazero evaluates each segment's offset expression on every
// instantiation: for a Go tool that was more than half the cost of a call.
// Merging neighbours into a few large segments, with the gaps filled by the
// zeros the memory holds anyway, gives the same initial memory.
package wasmopt

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// ErrMalformed is returned for input that is not a well-formed module.
var ErrMalformed = errors.New("malformed wasm module")

const (
	secImport    = 2
	secData      = 11
	secDataCount = 12

	// maxGap is the largest run of zeros inserted to join two segments.
	// Larger gaps stay separate so that a sparse module does not grow.
	maxGap = 4096
)

var header = []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}

type segment struct {
	offset uint32
	data   []byte
}

// MergeData returns mod with adjacent active data segments merged. It
// returns mod unchanged when merging is not provably safe: an imported
// memory (whose contents the zeros could overwrite), passive segments or a
// data count section (code may name segments by index), non-constant
// offsets, or overlapping segments.
func MergeData(mod []byte) ([]byte, error) {
	if len(mod) < len(header) || !bytes.Equal(mod[:len(header)], header) {
		return nil, fmt.Errorf("%w: bad header", ErrMalformed)
	}
	var (
		dataStart, dataEnd int // section payload bounds
		dataSecStart       int // start of the section id byte
		found              bool
	)
	p := len(header)
	for p < len(mod) {
		id := mod[p]
		size, n, err := readU32(mod[p+1:])
		if err != nil {
			return nil, err
		}
		start := p + 1 + n
		end := start + int(size)
		if end > len(mod) || end < start {
			return nil, fmt.Errorf("%w: section %d overruns module", ErrMalformed, id)
		}
		switch id {
		case secImport:
			imported, err := importsMemory(mod[start:end])
			if err != nil {
				return nil, err
			}
			if imported {
				return mod, nil
			}
		case secDataCount:
			return mod, nil
		case secData:
			dataSecStart, dataStart, dataEnd, found = p, start, end, true
		}
		p = end
	}
	if !found {
		return mod, nil
	}
	segs, ok, err := parseData(mod[dataStart:dataEnd])
	if err != nil || !ok {
		return mod, err
	}
	merged := merge(segs)
	if len(merged) == len(segs) {
		return mod, nil
	}
	payload := encodeData(merged)
	out := make([]byte, 0, len(mod)-(dataEnd-dataSecStart)+len(payload)+6)
	out = append(out, mod[:dataSecStart]...)
	out = append(out, secData)
	out = appendU32(out, uint32(len(payload)))
	out = append(out, payload...)
	out = append(out, mod[dataEnd:]...)
	return out, nil
}

// parseData reads a data section. ok is false when a segment is of a kind
// merging must not touch.
func parseData(b []byte) (segs []segment, ok bool, err error) {
	count, n, err := readU32(b)
	if err != nil {
		return nil, false, err
	}
	b = b[n:]
	segs = make([]segment, 0, min(count, uint32(len(b))))
	for i := uint32(0); i < count; i++ {
		flag, n, err := readU32(b)
		if err != nil {
			return nil, false, err
		}
		if flag != 0 { // passive, or an explicit memory index
			return nil, false, nil
		}
		b = b[n:]
		// The offset must be exactly `i32.const N; end`.
		if len(b) < 1 || b[0] != 0x41 {
			return nil, false, nil
		}
		off, n, err := readS32(b[1:])
		if err != nil {
			return nil, false, err
		}
		b = b[1+n:]
		if len(b) < 1 || b[0] != 0x0b {
			return nil, false, nil
		}
		b = b[1:]
		size, n, err := readU32(b)
		if err != nil {
			return nil, false, err
		}
		b = b[n:]
		if uint64(size) > uint64(len(b)) {
			return nil, false, fmt.Errorf("%w: data segment %d overruns section", ErrMalformed, i)
		}
		if off < 0 {
			return nil, false, nil
		}
		segs = append(segs, segment{offset: uint32(off), data: b[:size:size]})
		b = b[size:]
	}
	if len(b) != 0 {
		return nil, false, fmt.Errorf("%w: trailing bytes in data section", ErrMalformed)
	}
	// Disjoint segments may be applied in any order, so sorting them is
	// safe; overlapping ones are not, because the later write wins.
	slices.SortStableFunc(segs, func(a, b segment) int { return cmp.Compare(a.offset, b.offset) })
	var end uint64
	for _, s := range segs {
		if uint64(s.offset) < end {
			return nil, false, nil
		}
		end = uint64(s.offset) + uint64(len(s.data))
	}
	return segs, true, nil
}

func merge(segs []segment) []segment {
	var out []segment
	for _, s := range segs {
		if k := len(out) - 1; k >= 0 {
			last := &out[k]
			lastEnd := uint64(last.offset) + uint64(len(last.data))
			if gap := uint64(s.offset) - lastEnd; gap <= maxGap {
				// last.data has len == cap, so append never writes into mod.
				last.data = append(append(last.data, make([]byte, gap)...), s.data...)
				continue
			}
		}
		out = append(out, s)
	}
	return out
}

func encodeData(segs []segment) []byte {
	var out []byte
	out = appendU32(out, uint32(len(segs)))
	for _, s := range segs {
		out = append(out, 0x00, 0x41)
		out = appendS32(out, int32(s.offset))
		out = append(out, 0x0b)
		out = appendU32(out, uint32(len(s.data)))
		out = append(out, s.data...)
	}
	return out
}

// importsMemory reports whether an import section imports a memory.
func importsMemory(b []byte) (bool, error) {
	count, n, err := readU32(b)
	if err != nil {
		return false, err
	}
	b = b[n:]
	for i := uint32(0); i < count; i++ {
		for j := 0; j < 2; j++ { // module and field names
			l, n, err := readU32(b)
			if err != nil {
				return false, err
			}
			if uint64(n)+uint64(l) > uint64(len(b)) {
				return false, fmt.Errorf("%w: import name overruns section", ErrMalformed)
			}
			b = b[n+int(l):]
		}
		if len(b) < 1 {
			return false, fmt.Errorf("%w: truncated import", ErrMalformed)
		}
		kind := b[0]
		b = b[1:]
		switch kind {
		case 0: // function: type index
			_, n, err := readU32(b)
			if err != nil {
				return false, err
			}
			b = b[n:]
		case 1: // table: reftype + limits
			if len(b) < 1 {
				return false, fmt.Errorf("%w: truncated table import", ErrMalformed)
			}
			if b, err = skipLimits(b[1:]); err != nil {
				return false, err
			}
		case 2:
			return true, nil
		case 3: // global: valtype + mutability
			if len(b) < 2 {
				return false, fmt.Errorf("%w: truncated global import", ErrMalformed)
			}
			b = b[2:]
		default:
			// Unknown import kinds (tags, future proposals): be conservative.
			return true, nil
		}
	}
	return false, nil
}

func skipLimits(b []byte) ([]byte, error) {
	if len(b) < 1 {
		return nil, fmt.Errorf("%w: truncated limits", ErrMalformed)
	}
	flag := b[0]
	b = b[1:]
	nums := 1
	if flag&1 != 0 {
		nums = 2
	}
	for i := 0; i < nums; i++ {
		_, n, err := readU64(b)
		if err != nil {
			return nil, err
		}
		b = b[n:]
	}
	return b, nil
}
