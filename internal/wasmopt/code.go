package wasmopt

import "fmt"

// Opcodes Meter emits or looks for.
const (
	opUnreachable = 0x00
	opIf          = 0x04
	opElse        = 0x05
	opEnd         = 0x0b
	opCall        = 0x10
	opLocalGet    = 0x20
	opLocalSet    = 0x21
	opLocalTee    = 0x22
	opGlobalGet   = 0x23
	opGlobalSet   = 0x24
	opI32Const    = 0x41
	opI64Const    = 0x42
	opI32Ne       = 0x47
	opI64GtU      = 0x56
	opI64Add      = 0x7c
	opI64Sub      = 0x7d
	opI64Shl      = 0x86
	opI64ExtendU  = 0xad
	opPrefixMisc  = 0xfc
	opTableGrow   = 15 // after opPrefixMisc

	blockEmpty = 0x40
	typeI32    = 0x7f
	typeI64    = 0x7e
)

// function returns the body of function fn rewritten: its frame charged on
// entry, the stack figure put back after every call of a function of the
// module, and table.grow guarded by the room. It checks that the body uses
// no local or global index past its own declarations, which would
// otherwise reach the locals and globals Meter adds.
func (m *meter) function(fn uint32, body []byte) ([]byte, error) {
	ft := m.types[m.funcTypes[fn]]
	r := &reader{b: body}
	entries := r.count()
	var locals uint64
	for i := uint32(0); i < entries && r.ok(); i++ {
		locals += uint64(r.u32())
		r.valType()
		if err := over(fmt.Sprintf("locals in function %d", fn), locals, uint64(m.lim.FunctionLocals)); err != nil {
			return nil, err
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	m.locals += locals
	if err := over("locals in all functions", m.locals, m.lim.ModuleLocals); err != nil {
		return nil, err
	}
	decl := body[:len(body)-len(r.b)]
	w := walker{
		m:     m,
		fn:    fn,
		code:  r.b,
		slots: ft.params + uint32(locals),
		out:   make([]byte, 0, len(r.b)+len(r.b)/4+16),
	}
	if err := w.walk(); err != nil {
		return nil, fmt.Errorf("function %d: %w", fn, err)
	}

	// The locals Meter adds, after the function's own: mine (i64), then,
	// for table.grow, cost (i64), delta and result (i32), and a funcref
	// and an externref to hold the grown table's initial value.
	r = &reader{b: decl}
	r.u32()
	extra := []byte{1, typeI64}
	n := entries + 1
	if w.grows {
		extra = append(extra, 1, typeI64, 2, typeI32, 1, refFunc, 1, refExtern)
		n += 4
	}
	out := make([]byte, 0, len(decl)+len(extra)+32+len(w.out))
	out = appendU32(out, n)
	out = append(out, r.b...)
	out = append(out, extra...)
	// Meter's own code holds up to four operands more.
	frame := FrameBytes(w.slots+uint32(w.height)+4, w.arity)
	m.info.MaxFrameBytes = max(m.info.MaxFrameBytes, frame)
	out = w.enter(out, frame)
	return append(out, w.out...), nil
}

// walker rewrites one function's instructions.
type walker struct {
	m      *meter
	fn     uint32
	code   []byte
	slots  uint32 // parameters and declared locals
	out    []byte
	arity  uint32 // the most parameters or results of a function it calls
	height int    // the most operands on its stack at once
	grows  bool   // it has a table.grow
}

// Indices of the locals Meter adds.
func (w *walker) mine() uint32  { return w.slots }
func (w *walker) cost() uint32  { return w.slots + 1 }
func (w *walker) delta() uint32 { return w.slots + 2 }
func (w *walker) res() uint32   { return w.slots + 3 }
func (w *walker) ref(t byte) uint32 {
	if t == refFunc {
		return w.slots + 4
	}
	return w.slots + 5
}

func (w *walker) op(b ...byte) { w.out = append(w.out, b...) }

func (w *walker) idx(op byte, i uint32) {
	w.out = append(w.out, op)
	w.out = appendU32(w.out, i)
}

// enter appends the entry check: charge the frame, trap past the room.
func (w *walker) enter(out []byte, frame uint64) []byte {
	s, room := w.m.stackGlobal(), w.m.roomGlobal()
	out = appendU32(append(out, opGlobalGet), s)
	out = appendS64(append(out, opI64Const), int64(frame))
	out = append(out, opI64Add)
	out = appendU32(append(out, opLocalTee), w.mine())
	out = appendU32(append(out, opGlobalGet), room)
	out = append(out, opI64GtU, opIf, blockEmpty, opI64Const, 0x7f) // i64.const -1
	out = appendU32(append(out, opGlobalSet), s)
	out = append(out, opUnreachable, opEnd)
	out = appendU32(append(out, opLocalGet), w.mine())
	return appendU32(append(out, opGlobalSet), s)
}

// restore puts the caller's stack figure back after a call.
func (w *walker) restore() {
	w.idx(opLocalGet, w.mine())
	w.idx(opGlobalSet, w.m.stackGlobal())
}

// grow replaces table.grow of table t (operands: initial value, delta).
func (w *walker) grow(t uint32) {
	s, room := w.m.stackGlobal(), w.m.roomGlobal()
	w.idx(opLocalSet, w.delta())
	w.idx(opLocalSet, w.ref(w.m.tableTypes[t]))
	// cost = delta * TableEntryBytes; over = stack + cost > room
	w.idx(opLocalGet, w.delta())
	w.op(opI64ExtendU, opI64Const, 4, opI64Shl) // TableEntryBytes == 1<<4
	w.idx(opLocalTee, w.cost())
	w.idx(opGlobalGet, s)
	w.op(opI64Add)
	w.idx(opGlobalGet, room)
	w.op(opI64GtU, opIf, typeI32, opI32Const, 0x7f) // over: -1
	w.op(opElse)
	w.idx(opLocalGet, w.ref(w.m.tableTypes[t]))
	w.idx(opLocalGet, w.delta())
	w.op(opPrefixMisc, opTableGrow)
	w.out = appendU32(w.out, t)
	w.idx(opLocalTee, w.res())
	w.op(opI32Const, 0x7f, opI32Ne, opIf, blockEmpty) // grown: room -= cost
	w.idx(opGlobalGet, room)
	w.idx(opLocalGet, w.cost())
	w.op(opI64Sub)
	w.idx(opGlobalSet, room)
	w.op(opEnd)
	w.idx(opLocalGet, w.res())
	w.op(opEnd)
}

func (w *walker) callArity(ft funcType) {
	w.arity = max(w.arity, ft.params, ft.results)
}

// ctl is an open block: the operand stack height below it, and its
// parameters and results.
type ctl struct {
	base, params, results int
}

// walk copies the instructions to out with Meter's additions, and tracks
// the operand stack's height: the most values the function holds at once
// (each may take a spill slot).
func (w *walker) walk() error {
	r := &reader{b: w.code}
	ft := w.m.types[w.m.funcTypes[w.fn]]
	ctls := []ctl{{results: int(ft.results)}}
	h := 0
	pop := func(n int) {
		if h -= n; h < ctls[len(ctls)-1].base {
			h = ctls[len(ctls)-1].base // below a branch: the stack is polymorphic
		}
	}
	push := func(n int) {
		if h += n; h > w.height {
			w.height = h
		}
	}
	dead := func() { h = ctls[len(ctls)-1].base } // after br, return, unreachable
	for r.ok() {
		start := len(w.code) - len(r.b)
		op := r.byte()
		restore := false // put the stack figure back after the instruction
		copyIt := true
		switch {
		case op == 0x01: // nop
		case op == opUnreachable, op == 0x0f: // unreachable, return
			dead()
		case op == opEnd:
			c := ctls[len(ctls)-1]
			ctls = ctls[:len(ctls)-1]
			h = c.base
			push(c.results)
		case op == opElse:
			c := ctls[len(ctls)-1]
			h = c.base
			push(c.params)
		case op >= 0x02 && op <= opIf: // block, loop, if: a block type
			if op == opIf {
				pop(1)
			}
			params, results := w.blockType(r)
			pop(params)
			ctls = append(ctls, ctl{base: h, params: params, results: results})
			push(params)
		case op == 0x0c: // br
			r.u32()
			dead()
		case op == 0x0d: // br_if
			r.u32()
			pop(1)
		case op == 0x0e: // br_table
			n := r.count()
			for i := uint32(0); i <= n && r.ok(); i++ {
				r.u32()
			}
			dead()
		case op == opCall:
			f := r.u32()
			if r.ok() && f >= uint32(len(w.m.funcTypes)) {
				r.malformed("call of function %d out of range", f)
				break
			}
			if r.ok() {
				ft := w.m.types[w.m.funcTypes[f]]
				w.callArity(ft)
				pop(int(ft.params))
				push(int(ft.results))
				restore = f >= w.m.importedFuncs
			}
		case op == 0x11: // call_indirect
			t := w.m.typeIndex(r)
			r.u32()
			if r.ok() {
				ft := w.m.types[t]
				w.callArity(ft)
				pop(1 + int(ft.params))
				push(int(ft.results))
				restore = true
			}
		case op == 0x1a: // drop
			pop(1)
		case op == 0x1b: // select
			pop(3)
			push(1)
		case op == 0x1c: // select with types
			if n := r.u32(); n != 1 && r.ok() {
				r.malformed("select with %d types", n)
			}
			r.valType()
			pop(3)
			push(1)
		case op >= opLocalGet && op <= opLocalTee:
			if i := r.u32(); r.ok() && i >= w.slots {
				r.malformed("local %d out of range", i)
			}
			switch op {
			case opLocalGet:
				push(1)
			case opLocalSet:
				pop(1)
			}
		case op == opGlobalGet, op == opGlobalSet:
			if i := r.u32(); r.ok() && i >= w.m.globals {
				r.malformed("global %d out of range", i)
			}
			if op == opGlobalGet {
				push(1)
			} else {
				pop(1)
			}
		case op == 0x25: // table.get
			r.u32()
			pop(1)
			push(1)
		case op == 0x26: // table.set
			r.u32()
			pop(2)
		case op >= 0x28 && op <= 0x35: // loads
			r.u32()
			r.u32()
			pop(1)
			push(1)
		case op >= 0x36 && op <= 0x3e: // stores
			r.u32()
			r.u32()
			pop(2)
		case op == 0x3f: // memory.size
			r.u32()
			push(1)
		case op == 0x40: // memory.grow
			r.u32()
			pop(1)
			push(1)
		case op == opI32Const:
			r.leb(5)
			push(1)
		case op == opI64Const:
			r.leb(10)
			push(1)
		case op == 0x43:
			r.bytes(4)
			push(1)
		case op == 0x44:
			r.bytes(8)
			push(1)
		case op >= 0x45 && op <= 0xc4:
			pop(numericOperands(op))
			push(1)
		case op == 0xd0: // ref.null
			r.refType()
			push(1)
		case op == 0xd1: // ref.is_null
			pop(1)
			push(1)
		case op == 0xd2: // ref.func
			r.u32()
			push(1)
		case op == opPrefixMisc:
			switch sub := r.u32(); {
			case sub <= 7: // saturating truncations
				pop(1)
				push(1)
			case sub == 9, sub == 13: // data.drop, elem.drop
				r.u32()
			case sub == 11: // memory.fill
				r.u32()
				pop(3)
			case sub == 8, sub == 10, sub == 12, sub == 14: // memory.init, memory.copy, table.init, table.copy
				r.u32()
				r.u32()
				pop(3)
			case sub == 16: // table.size
				r.u32()
				push(1)
			case sub == 17: // table.fill
				r.u32()
				pop(3)
			case sub == opTableGrow:
				t := r.u32()
				if r.ok() && t >= uint32(len(w.m.tableTypes)) {
					r.malformed("table.grow of table %d out of range", t)
				}
				if r.ok() {
					w.grows = true
					copyIt = false
					w.grow(t)
				}
				pop(2)
				push(1)
			default:
				r.unsupported("instruction 0xfc %d", sub)
			}
		case op == 0xfd: // SIMD
			sub := r.u32()
			switch {
			case sub <= 11, sub == 92, sub == 93:
				r.u32()
				r.u32()
			case sub == 12, sub == 13:
				r.bytes(16)
			case sub >= 21 && sub <= 34:
				r.byte()
			case sub >= 84 && sub <= 91:
				r.u32()
				r.u32()
				r.byte()
			case sub > 255:
				r.unsupported("instruction 0xfd %d", sub)
			}
			if r.ok() {
				pops, pushes := simdOperands(sub)
				pop(pops)
				push(pushes)
			}
		default:
			r.unsupported("instruction 0x%x", op)
		}
		if r.err != nil {
			return r.err
		}
		if copyIt {
			w.out = append(w.out, w.code[start:len(w.code)-len(r.b)]...)
		}
		if restore {
			w.restore()
		}
		if len(ctls) == 0 {
			if len(r.b) != 0 {
				return fmt.Errorf("%w: %d bytes after the end of a function", ErrMalformed, len(r.b))
			}
			return nil
		}
	}
	if r.err != nil {
		return r.err
	}
	return fmt.Errorf("%w: a function body without its end", ErrMalformed)
}

// blockType reads a block type: none, one value, or a function type's
// parameters and results.
func (w *walker) blockType(r *reader) (params, results int) {
	if len(r.b) > 0 {
		switch c := r.b[0]; {
		case c == blockEmpty:
			r.byte()
			return 0, 0
		case c&0xc0 == 0x40: // a one-byte negative: a value type
			r.valType()
			return 0, 1
		}
	}
	t := r.s33()
	if r.ok() && (t < 0 || t >= int64(len(w.m.types))) {
		r.malformed("block type %d out of range", t)
		return 0, 0
	}
	ft := w.m.types[t]
	return int(ft.params), int(ft.results)
}

// numericOperands is how many operands a numeric instruction (0x45 to
// 0xc4) takes: tests and unary operations and conversions one, others two.
func numericOperands(op byte) int {
	switch {
	case op == 0x45, op == 0x50, // eqz
		op >= 0x67 && op <= 0x69, op >= 0x79 && op <= 0x7b, // clz, ctz, popcnt
		op >= 0x8b && op <= 0x91, op >= 0x99 && op <= 0x9f, // float unary
		op >= 0xa7: // conversions, sign extensions
		return 1
	}
	return 2
}

// simdOperands is what a SIMD instruction (0xfd sub) pops and pushes.
func simdOperands(sub uint32) (pops, pushes int) {
	switch {
	case sub == 12: // v128.const
		return 0, 1
	case sub == 11, sub >= 88 && sub <= 91: // stores
		return 2, 0
	case sub == 82: // bitselect
		return 3, 1
	case sub <= 10, sub >= 15 && sub <= 22, sub == 24, sub == 25, sub == 27, sub == 29, sub == 31, sub == 33,
		sub == 77, sub == 83, sub >= 92 && sub <= 100, sub >= 103 && sub <= 106, sub == 116, sub == 117,
		sub == 122, sub >= 124 && sub <= 129, sub == 131, sub == 132, sub >= 135 && sub <= 138, sub == 148,
		sub == 160, sub == 161, sub == 163, sub == 164, sub >= 167 && sub <= 170,
		sub == 192, sub == 193, sub == 195, sub == 196, sub >= 199 && sub <= 202,
		sub == 224, sub == 225, sub == 227, sub == 236, sub == 237, sub == 239, sub >= 248:
		return 1, 1 // loads, splats, lane extractions, unary operations, conversions
	}
	return 2, 1
}

func appendS64(b []byte, v int64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}
