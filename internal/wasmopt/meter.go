package wasmopt

import (
	"bytes"
	"fmt"
)

// Meter's accounting. A metered module keeps two exported mutable i64
// globals:
//
//   - StackGlobal: the bytes charged for the frames on the call stack. A
//     function adds its FrameBytes on entry and every call site puts the
//     caller's own figure back when the callee returns, so the global
//     always holds the sum over the frames below.
//   - RoomGlobal: the bytes the stack and table growth may use. The host
//     sets it for each call (what the sandbox's memory limit leaves once
//     linear memory and the instance's tables are counted) and lowers it
//     as linear memory grows.
//
// A function whose frame would take the stack past the room sets
// StackGlobal to StackOverflow and traps (unreachable). A table.grow by n
// entries is charged TableEntryBytes*n: past the room it returns -1 without
// growing, as a table at its maximum does; otherwise the room shrinks by
// the charge.
const (
	StackGlobal = "dsec.stack"
	RoomGlobal  = "dsec.room"
	// StackOverflow is StackGlobal's value after a call trapped on the room.
	StackOverflow = ^uint64(0)
	// InitialRoom is RoomGlobal's value in a new instance: what a start
	// function may use before the host sets a call's room.
	InitialRoom = 1 << 20
	// TableEntryBytes is the charge per table entry table.grow adds: a
	// reference takes 8 bytes in wazero, and growing a table appends to a
	// Go slice, which allocates ahead.
	TableEntryBytes = 16

	frameBase = 64
	slotBytes = 16
)

// FrameBytes is what a call of a function with the given parameters and
// locals (slots), calling functions of at most callArity parameters or
// results, is charged for its frame. It is an estimate of the frame
// wazero's compiler lays out: a saved frame pointer and return address,
// room for calls' arguments, and a spill slot per local. Compiled code can
// spill more (a value kept live across many calls takes a slot of its own
// each time), so a frame can exceed its charge; wazero's own ceiling on a
// call's stack then still applies.
func FrameBytes(slots, callArity uint32) uint64 {
	return frameBase + slotBytes*(uint64(slots)+uint64(callArity))
}

// Info is what Meter learnt of a module's declarations: the counts that
// cost host memory in every instance.
type Info struct {
	// Imports counts imports of every kind.
	Imports int
	// Globals counts imported and defined globals, with the two Meter adds.
	Globals int
	// Tables counts imported and defined tables; TableEntries adds up the
	// declared minimum sizes of defined tables.
	Tables       int
	TableEntries uint64
	// ElemEntries adds up the entries of all element segments.
	ElemEntries uint64
	// DataSegments counts data segments; DataBytes adds up the bytes of
	// active ones, written into linear memory at instantiation.
	DataSegments int
	DataBytes    uint64
	// MemoryPages is the memory's declared minimum (64 KiB pages), whether
	// defined or imported; HasMemory says whether there is one.
	MemoryPages uint64
	HasMemory   bool
	// MaxFrameBytes is the largest frame a function is charged.
	MaxFrameBytes uint64
	// Start says whether the module has a start function.
	Start bool
}

type funcType struct{ params, results uint32 }

type rawSection struct {
	id      byte
	payload []byte
}

// meter holds what the sections read so far declared.
type meter struct {
	lim           Limits
	info          Info
	types         []funcType
	funcTypes     []uint32 // type index of every function, imported first
	importedFuncs uint32
	tableTypes    []byte // reference type of every table, imported first
	globals       uint32 // imported and defined, before Meter's own
	locals        uint64 // all functions' locals so far
	exports       bool
}

// Meter checks mod against lim and returns it rewritten to account for its
// call stack and table growth (see StackGlobal), with what it declares.
// mod is not modified.
//
// Errors: a *LimitError for a module past lim; ErrMalformed for bytes that
// are not a module; ErrUnsupported for a feature the runtime does not
// enable, or an export under one of Meter's names.
func Meter(mod []byte, lim Limits) ([]byte, Info, error) {
	if len(mod) < len(header) || !bytes.Equal(mod[:len(header)], header) {
		return nil, Info{}, fmt.Errorf("%w: bad header", ErrMalformed)
	}
	m := &meter{lim: lim}
	var secs []rawSection
	r := &reader{b: mod[len(header):]}
	for len(r.b) > 0 && r.ok() {
		id := r.byte()
		payload := r.bytes(uint64(r.u32()))
		if r.err != nil {
			break
		}
		s := rawSection{id: id, payload: payload}
		var err error
		switch id {
		case 0: // custom: kept as is
		case secType:
			err = m.typeSection(payload)
		case secImport:
			err = m.importSection(payload)
		case secFunction:
			err = m.functionSection(payload)
		case secTable:
			err = m.tableSection(payload)
		case secMemory:
			err = m.memorySection(payload)
		case secGlobal:
			err = m.globalSection(payload)
		case secExport:
			err = m.exportSection(payload)
		case secStart:
			pr := &reader{b: payload}
			pr.u32()
			err = pr.end()
			m.info.Start = true
		case secElement:
			err = m.elementSection(payload)
		case secDataCount:
			pr := &reader{b: payload}
			pr.u32()
			err = pr.err
		case secCode:
			s.payload, err = m.codeSection(payload)
		case secData:
			err = m.dataSection(payload)
		default:
			err = fmt.Errorf("%w: section %d", ErrUnsupported, id)
		}
		if err != nil {
			return nil, Info{}, err
		}
		secs = append(secs, s)
	}
	if r.err != nil {
		return nil, Info{}, r.err
	}
	if len(m.funcTypes) > int(m.importedFuncs) && !hasSection(secs, secCode) {
		return nil, Info{}, fmt.Errorf("%w: functions without a code section", ErrMalformed)
	}
	secs = m.addGlobals(secs)
	secs = m.addExports(secs)
	m.info.Globals = int(m.globals) + 2

	size := len(header)
	for _, s := range secs {
		size += 1 + 5 + len(s.payload)
	}
	out := make([]byte, 0, size)
	out = append(out, header...)
	for _, s := range secs {
		out = append(out, s.id)
		out = appendU32(out, uint32(len(s.payload)))
		out = append(out, s.payload...)
	}
	return out, m.info, nil
}

const (
	secType     = 1
	secFunction = 3
	secTable    = 4
	secMemory   = 5
	secGlobal   = 6
	secExport   = 7
	secStart    = 8
	secElement  = 9
	secCode     = 10
)

// order is a section's place in a module (the data count section comes
// between elements and code).
func order(id byte) int {
	switch id {
	case secDataCount:
		return 11
	case secCode:
		return 12
	case secData:
		return 13
	}
	return int(id)
}

func hasSection(secs []rawSection, id byte) bool {
	for _, s := range secs {
		if s.id == id {
			return true
		}
	}
	return false
}

// put replaces the section with s's id, or inserts s where the binary
// format puts it: just after the last section that must come before it,
// so that custom sections keep their neighbours.
func put(secs []rawSection, s rawSection) []rawSection {
	at := 0
	for i := range secs {
		if secs[i].id == s.id {
			secs[i] = s
			return secs
		}
		if secs[i].id != 0 && order(secs[i].id) < order(s.id) {
			at = i + 1
		}
	}
	return append(secs[:at], append([]rawSection{s}, secs[at:]...)...)
}

func payloadOf(secs []rawSection, id byte) []byte {
	for _, s := range secs {
		if s.id == id {
			return s.payload
		}
	}
	return nil
}

// addGlobals appends StackGlobal's and RoomGlobal's globals.
func (m *meter) addGlobals(secs []rawSection) []rawSection {
	old := payloadOf(secs, secGlobal)
	var n uint32
	var rest []byte
	if old != nil {
		r := &reader{b: old}
		n = r.u32()
		rest = r.b
	}
	p := appendU32(nil, n+2)
	p = append(p, rest...)
	p = append(p, 0x7e, 1, 0x42, 0, 0x0b)
	p = append(p, 0x7e, 1, 0x42)
	p = appendS64(p, InitialRoom)
	p = append(p, 0x0b)
	return put(secs, rawSection{id: secGlobal, payload: p})
}

func (m *meter) addExports(secs []rawSection) []rawSection {
	old := payloadOf(secs, secExport)
	var n uint32
	var rest []byte
	if old != nil {
		r := &reader{b: old}
		n = r.u32()
		rest = r.b
	}
	p := appendU32(nil, n+2)
	p = append(p, rest...)
	p = name(p, StackGlobal)
	p = append(p, 3)
	p = appendU32(p, m.stackGlobal())
	p = name(p, RoomGlobal)
	p = append(p, 3)
	p = appendU32(p, m.roomGlobal())
	return put(secs, rawSection{id: secExport, payload: p})
}

func (m *meter) stackGlobal() uint32 { return m.globals }
func (m *meter) roomGlobal() uint32  { return m.globals + 1 }

func name(b []byte, s string) []byte {
	return append(appendU32(b, uint32(len(s))), s...)
}

func (m *meter) typeSection(b []byte) error {
	r := &reader{b: b}
	n := r.count()
	if err := over("types", uint64(n), uint64(m.lim.Types)); err != nil {
		return err
	}
	m.types = make([]funcType, 0, n)
	for i := uint32(0); i < n && r.ok(); i++ {
		if form := r.byte(); form != 0x60 && r.ok() {
			r.unsupported("type form 0x%x", form)
		}
		var ft funcType
		ft.params = r.count()
		for j := uint32(0); j < ft.params && r.ok(); j++ {
			r.valType()
		}
		ft.results = r.count()
		for j := uint32(0); j < ft.results && r.ok(); j++ {
			r.valType()
		}
		if err := over("parameters in a function type", uint64(ft.params), uint64(m.lim.Params)); err != nil {
			return err
		}
		if err := over("results in a function type", uint64(ft.results), uint64(m.lim.Results)); err != nil {
			return err
		}
		m.types = append(m.types, ft)
	}
	return r.end()
}

// end reports a section's error, or trailing bytes.
func (r *reader) end() error {
	if r.err == nil && len(r.b) != 0 {
		r.malformed("%d trailing bytes in a section", len(r.b))
	}
	return r.err
}

func (m *meter) typeIndex(r *reader) uint32 {
	t := r.u32()
	if r.ok() && t >= uint32(len(m.types)) {
		r.malformed("type index %d out of range", t)
	}
	return t
}

func (m *meter) importSection(b []byte) error {
	r := &reader{b: b}
	n := r.count()
	if err := over("imports", uint64(n), uint64(m.lim.Imports)); err != nil {
		return err
	}
	m.info.Imports = int(n)
	for i := uint32(0); i < n && r.ok(); i++ {
		r.name()
		r.name()
		switch kind := r.byte(); kind {
		case 0:
			m.funcTypes = append(m.funcTypes, m.typeIndex(r))
			m.importedFuncs++
		case 1:
			m.tableTypes = append(m.tableTypes, r.refType())
			r.limits()
		case 2:
			m.info.MemoryPages = r.limits()
			m.info.HasMemory = true
		case 3:
			r.valType()
			r.byte()
			m.globals++
		default:
			r.unsupported("import kind %d", kind)
		}
	}
	m.info.Tables = len(m.tableTypes)
	return r.end()
}

func (m *meter) functionSection(b []byte) error {
	r := &reader{b: b}
	n := r.count()
	if err := over("functions", uint64(m.importedFuncs)+uint64(n), uint64(m.lim.Functions)); err != nil {
		return err
	}
	for i := uint32(0); i < n && r.ok(); i++ {
		m.funcTypes = append(m.funcTypes, m.typeIndex(r))
	}
	return r.end()
}

func (m *meter) tableSection(b []byte) error {
	r := &reader{b: b}
	n := r.count()
	if err := over("tables", uint64(len(m.tableTypes))+uint64(n), uint64(m.lim.Tables)); err != nil {
		return err
	}
	for i := uint32(0); i < n && r.ok(); i++ {
		if len(r.b) > 0 && r.b[0] == 0x40 {
			r.unsupported("table with an initializer")
		}
		m.tableTypes = append(m.tableTypes, r.refType())
		m.info.TableEntries += r.limits()
		if err := over("table entries (declared minimum sizes)", m.info.TableEntries, m.lim.TableEntries); err != nil {
			return err
		}
	}
	m.info.Tables = len(m.tableTypes)
	return r.end()
}

func (m *meter) memorySection(b []byte) error {
	r := &reader{b: b}
	n := r.count()
	if n+boolU32(m.info.HasMemory) > 1 {
		return fmt.Errorf("%w: more than one memory", ErrUnsupported)
	}
	if n == 1 {
		m.info.MemoryPages = r.limits()
		m.info.HasMemory = true
	}
	return r.end()
}

func boolU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

func (m *meter) globalSection(b []byte) error {
	r := &reader{b: b}
	n := r.count()
	if err := over("globals", uint64(m.globals)+uint64(n), uint64(m.lim.Globals)); err != nil {
		return err
	}
	for i := uint32(0); i < n && r.ok(); i++ {
		r.valType()
		if mut := r.byte(); mut > 1 {
			r.malformed("global mutability %d", mut)
		}
		r.constExpr()
	}
	m.globals += n
	return r.end()
}

func (m *meter) exportSection(b []byte) error {
	r := &reader{b: b}
	n := r.count()
	if err := over("exports", uint64(n), uint64(m.lim.Exports)); err != nil {
		return err
	}
	for i := uint32(0); i < n && r.ok(); i++ {
		if nm := r.name(); nm == StackGlobal || nm == RoomGlobal {
			r.unsupported("the module exports %q, a name the runtime reserves", nm)
		}
		r.byte()
		r.u32()
	}
	return r.end()
}

func (m *meter) elementSection(b []byte) error {
	r := &reader{b: b}
	n := r.count()
	for i := uint32(0); i < n && r.ok(); i++ {
		flags := r.u32()
		if flags > 7 {
			r.malformed("element segment flags %d", flags)
			break
		}
		if flags&3 == 2 { // explicit table index
			r.u32()
		}
		if flags&1 == 0 { // active: an offset
			r.constExpr()
		}
		if flags&3 != 0 { // element kind or reference type
			if flags&4 == 0 {
				if kind := r.byte(); kind != 0 {
					r.malformed("element kind %d", kind)
				}
			} else {
				r.refType()
			}
		}
		k := r.count()
		m.info.ElemEntries += uint64(k)
		if err := over("element segment entries", m.info.ElemEntries, m.lim.ElemEntries); err != nil {
			return err
		}
		for j := uint32(0); j < k && r.ok(); j++ {
			if flags&4 == 0 {
				r.u32()
			} else {
				r.constExpr()
			}
		}
	}
	return r.end()
}

func (m *meter) dataSection(b []byte) error {
	r := &reader{b: b}
	n := r.count()
	if err := over("data segments", uint64(n), uint64(m.lim.DataSegments)); err != nil {
		return err
	}
	m.info.DataSegments = int(n)
	for i := uint32(0); i < n && r.ok(); i++ {
		flag := r.u32()
		switch flag {
		case 0:
			r.constExpr()
		case 1:
		case 2:
			r.u32()
			r.constExpr()
		default:
			r.malformed("data segment flag %d", flag)
		}
		size := r.u32()
		r.bytes(uint64(size))
		if flag != 1 {
			m.info.DataBytes += uint64(size)
		}
	}
	return r.end()
}

func (m *meter) codeSection(b []byte) ([]byte, error) {
	r := &reader{b: b}
	n := r.count()
	if r.ok() && uint64(n)+uint64(m.importedFuncs) != uint64(len(m.funcTypes)) {
		return nil, fmt.Errorf("%w: %d function bodies for %d functions", ErrMalformed, n, len(m.funcTypes)-int(m.importedFuncs))
	}
	out := make([]byte, 0, len(b)+len(b)/4+64*int(n))
	out = appendU32(out, n)
	for i := uint32(0); i < n && r.ok(); i++ {
		size := r.u32()
		if err := over(fmt.Sprintf("bytes in the body of function %d", m.importedFuncs+i), uint64(size), uint64(m.lim.BodyBytes)); err != nil {
			return nil, err
		}
		body := r.bytes(uint64(size))
		if r.err != nil {
			break
		}
		nb, err := m.function(m.importedFuncs+i, body)
		if err != nil {
			return nil, err
		}
		out = appendU32(out, uint32(len(nb)))
		out = append(out, nb...)
	}
	return out, r.end()
}
