package wasmopt

import (
	"errors"
	"fmt"
)

// Limits bound what a module may declare. Meter refuses a module past any
// of them with a *LimitError, before anything else reads it: several of
// these counts are turned into host memory by the decoder or by every
// instantiation (wazero allocates a function's local types when it decodes
// the function, and a table's declared minimum, its globals and its
// element entries when it instantiates), so an unchecked 45-byte module
// can ask for gigabytes.
type Limits struct {
	Types, Functions, Imports, Exports, Globals, DataSegments, Tables uint32
	// TableEntries bounds the declared minimum size of all tables together.
	TableEntries uint64
	// ElemEntries bounds the entries of all element segments together.
	ElemEntries uint64
	// Params and Results bound a function type.
	Params, Results uint32
	// FunctionLocals bounds one function's locals; ModuleLocals all of
	// them together.
	FunctionLocals uint32
	ModuleLocals   uint64
	// BodyBytes bounds a function body.
	BodyBytes uint32
}

// DefaultLimits are the WebAssembly JavaScript API's implementation limits
// (what every browser accepts) where those are small enough to be
// harmless, and tighter where a count costs host memory per instance or
// per compiled module: globals (about 90 bytes each per instance), types
// (some 200 bytes each compiled), tables, element entries (some 60 bytes
// each while compiling; at most one per function) and the sum of all
// locals (the JavaScript API bounds locals per function only). Toolchains
// stay far below: a Go tool declares 16 types, 8 globals and one table of
// 6,604 entries, 2,508 of them from element segments.
var DefaultLimits = Limits{
	Types:          1 << 16,
	Functions:      1_000_000,
	Imports:        100_000,
	Exports:        100_000,
	Globals:        100_000,
	DataSegments:   100_000,
	Tables:         1_000,
	TableEntries:   10_000_000,
	ElemEntries:    1_000_000,
	Params:         1_000,
	Results:        1_000,
	FunctionLocals: 50_000,
	ModuleLocals:   1 << 22,
	BodyBytes:      7_654_321,
}

// LimitError reports a module past one of its Limits.
type LimitError struct {
	// What names the count, e.g. "locals in function 3".
	What  string
	Count uint64
	Max   uint64
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("the module declares %d %s; at most %d are allowed", e.Count, e.What, e.Max)
}

// ErrUnsupported is wrapped by Meter's errors for a construct it does not
// rewrite: instructions and sections of proposals the runtime does not
// enable (threads, tail calls, exceptions, typed references, GC,
// multiple memories).
var ErrUnsupported = errors.New("unsupported wasm feature")

func over(what string, count, max uint64) error {
	if count > max {
		return &LimitError{What: what, Count: count, Max: max}
	}
	return nil
}
