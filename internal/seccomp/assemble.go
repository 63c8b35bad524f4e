package seccomp

import (
	"fmt"

	"golang.org/x/net/bpf"
)

// Seccomp return values (linux/seccomp.h).
const (
	retKillProcess = 0x80000000
	retErrno       = 0x00050000
	retAllow       = 0x7fff0000
)

// Offsets in struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// x32Bit marks x32 ABI syscall numbers on x86_64 (__X32_SYSCALL_BIT).
const x32Bit = 0x40000000

// target describes the architecture a filter is built for.
type target struct {
	auditArch uint32 // AUDIT_ARCH_* of the native ABI
	x32       bool   // x86_64: refuse the x32 ABI (same audit arch, x32Bit set)
	maxNr     int    // the highest syscall number the table knows
}

// assemble compiles rs (sorted by number) into a classic BPF program:
//
//  1. a foreign audit arch (i386 via int 0x80 on x86_64, arm32 on arm64)
//     kills the process; on x86_64 so does an x32 syscall number; -1 (a
//     syscall a tracer skipped) is allowed;
//  2. syscalls with argument conditions, each in a block that ends in a
//     return: allowed if any condition set holds, otherwise its errno;
//  3. syscalls that fail with their own errno (clone3: ENOSYS);
//  4. the always-allowed syscalls, found by a binary search (allowTree);
//  5. numbers beyond the table (syscalls newer than it) get ENOSYS, so
//     libc falls back to older calls; everything else EPERM.
//
// The syscall number is the accumulator in steps 3–5: no argument is ever
// loaded on a path that can go on to compare syscall numbers (step 2's
// blocks end in returns). go-seccomp-bpf v1.6.0's assembler gets this
// wrong (TestLibraryAssemblerBug), which is why this package only uses
// its syscall tables.
//
// Kernels since 5.11 cache the verdict of syscalls whose result depends
// only on the arch and number (every syscall of step 4), so an allowed
// syscall costs no filter run; the order above puts the frequent
// conditional one (clone, at every fork and thread) first. The kernel
// finds those verdicts when the filter is installed, by running the
// filter for every syscall number with interrupts off, at every
// sandbox's start: with step 4 a list of ~350 comparisons an install
// took ~0.35 ms of CPU, with the binary search ~0.17 ms.
func assemble(t target, rs []rule) ([]bpf.Instruction, error) {
	var a asm
	a.ld(offArch)
	a.jeq(t.auditArch, 1, 0)
	a.ret(retKillProcess)
	a.ld(offNr)
	// nr -1 is what a tracer sets to skip a syscall: no kernel code runs
	// (libseccomp issue 80), and it must not read as x32.
	a.jeq(0xffffffff, 0, 1)
	a.ret(retAllow)
	if t.x32 {
		a.jset(x32Bit, 0, 1)
		a.ret(retKillProcess)
	}
	for _, r := range rs {
		if r.allow || len(r.sets) == 0 {
			continue
		}
		if err := a.condBlock(r); err != nil {
			return nil, err
		}
	}
	for _, r := range rs {
		if !r.allow && len(r.sets) == 0 {
			a.jeq(uint32(r.nr), 0, 1)
			a.ret(retErrno | r.errno)
		}
	}
	var allow []uint32
	for _, r := range rs {
		if r.allow {
			allow = append(allow, uint32(r.nr))
		}
	}
	a.insns = append(a.insns, allowTree(allow, uint32(t.maxNr))...)
	if len(a.insns) > maxInsns {
		return nil, fmt.Errorf("the filter has %d instructions, more than the kernel's %d", len(a.insns), maxInsns)
	}
	return a.insns, nil
}

// leafSize is how many syscall numbers allowTree compares one by one.
const leafSize = 16

// allowTree returns step 4 and 5 of assemble for the sorted numbers
// allow (the accumulator holds the syscall number): a binary search on
// the number whose leaves compare up to leafSize numbers each and end in
// ALLOW on a match, otherwise in step 5's ENOSYS (above maxNr) or EPERM.
// Branches over a subtree use "ja", whose offset is not limited to 255.
func allowTree(allow []uint32, maxNr uint32) []bpf.Instruction {
	if len(allow) <= leafSize {
		var a asm
		for i, nr := range allow {
			// Jump to the "ret ALLOW" after the remaining comparisons
			// and the three instructions of step 5.
			a.jeq(nr, uint8(len(allow)-i-1+3), 0)
		}
		a.jgt(maxNr, 0, 1)
		a.ret(retErrno | errnoENOSYS)
		a.ret(retErrno | errnoEPERM)
		a.ret(retAllow)
		return a.insns
	}
	mid := len(allow) / 2
	lo, hi := allowTree(allow[:mid], maxNr), allowTree(allow[mid:], maxNr)
	var a asm
	// nr >= allow[mid]: on to "ja" over the lower half, into the upper.
	a.emit(bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: allow[mid], SkipTrue: 0, SkipFalse: 1})
	a.emit(bpf.Jump{Skip: uint32(len(lo))})
	return append(append(a.insns, lo...), hi...)
}

// maxInsns is BPF_MAXINSNS.
const maxInsns = 4096

// asm appends classic BPF instructions.
type asm struct{ insns []bpf.Instruction }

func (a *asm) emit(i bpf.Instruction) { a.insns = append(a.insns, i) }
func (a *asm) ld(off uint32)          { a.emit(bpf.LoadAbsolute{Off: off, Size: 4}) }
func (a *asm) ret(v uint32)           { a.emit(bpf.RetConstant{Val: v}) }
func (a *asm) jeq(k uint32, t, f uint8) {
	a.emit(bpf.JumpIf{Cond: bpf.JumpEqual, Val: k, SkipTrue: t, SkipFalse: f})
}
func (a *asm) jgt(k uint32, t, f uint8) {
	a.emit(bpf.JumpIf{Cond: bpf.JumpGreaterThan, Val: k, SkipTrue: t, SkipFalse: f})
}
func (a *asm) jset(k uint32, t, f uint8) {
	a.emit(bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: k, SkipTrue: t, SkipFalse: f})
}

// condBlock emits, for the syscall r.nr:
//
//	jeq nr, 0, 1 ; ja end
//	set 1: comparisons (failing → set 2) ; ret ALLOW
//	…
//	set n: comparisons (failing → deny)  ; ret ALLOW
//	deny:  ret ERRNO(r.errno)
//	end:
//
// Jumps inside a set only go forward to the end of the set (or of the
// next one), so they are short.
func (a *asm) condBlock(r rule) error {
	a.jeq(uint32(r.nr), 1, 0)
	skip := len(a.insns)
	a.emit(bpf.Jump{}) // patched below
	for _, set := range r.sets {
		var body []bpf.Instruction
		var fails []int // indexes in body of jumps to the next set
		for _, c := range set {
			code, f := compare(c)
			for _, i := range f {
				fails = append(fails, len(body)+i)
			}
			body = append(body, code...)
		}
		body = append(body, bpf.RetConstant{Val: retAllow})
		// A failing comparison jumps just past this set's "ret ALLOW".
		for _, i := range fails {
			j := body[i].(bpf.JumpIf)
			d := len(body) - i - 1
			if d > 255 {
				return fmt.Errorf("syscall %d: a condition set of %d instructions", r.nr, len(body))
			}
			if j.SkipTrue == failMark {
				j.SkipTrue = uint8(d)
			}
			if j.SkipFalse == failMark {
				j.SkipFalse = uint8(d)
			}
			body[i] = j
		}
		a.insns = append(a.insns, body...)
	}
	a.ret(retErrno | r.errno)
	a.insns[skip] = bpf.Jump{Skip: uint32(len(a.insns) - skip - 1)}
	return nil
}

// failMark stands for "the condition failed" in a jump compare returns;
// condBlock replaces it with the distance to the next set. Real skips
// inside one comparison are at most 3.
const failMark = 0xff

// compare returns the code for one 64-bit comparison, which falls through
// when c holds and takes a failMark jump when it does not, and the
// indexes of its failMark jumps. The argument's two halves are loaded
// separately (little-endian seccomp_data: low word first).
func compare(c cond) ([]bpf.Instruction, []int) {
	lo := bpf.LoadAbsolute{Off: offArgs + 8*uint32(c.arg), Size: 4}
	hi := bpf.LoadAbsolute{Off: offArgs + 8*uint32(c.arg) + 4, Size: 4}
	vhi, vlo := uint32(c.val>>32), uint32(c.val)
	j := func(cond bpf.JumpTest, k uint32, t, f uint8) bpf.JumpIf {
		return bpf.JumpIf{Cond: cond, Val: k, SkipTrue: t, SkipFalse: f}
	}
	const F = failMark
	var code []bpf.Instruction
	switch c.op {
	case opEQ: // hi == vhi && lo == vlo
		code = []bpf.Instruction{hi, j(bpf.JumpEqual, vhi, 0, F), lo, j(bpf.JumpEqual, vlo, 0, F)}
	case opNE: // hi != vhi || lo != vlo
		code = []bpf.Instruction{hi, j(bpf.JumpEqual, vhi, 0, 2), lo, j(bpf.JumpEqual, vlo, F, 0)}
	case opMaskedEQ: // hi&mhi == v2hi && lo&mlo == v2lo
		thi, tlo := uint32(c.two>>32), uint32(c.two)
		code = []bpf.Instruction{
			hi, bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: vhi}, j(bpf.JumpEqual, thi, 0, F),
			lo, bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: vlo}, j(bpf.JumpEqual, tlo, 0, F),
		}
	case opLT: // hi < vhi || hi == vhi && lo < vlo
		code = []bpf.Instruction{hi, j(bpf.JumpGreaterOrEqual, vhi, 0, 3), j(bpf.JumpEqual, vhi, 0, F), lo, j(bpf.JumpGreaterOrEqual, vlo, F, 0)}
	case opLE: // hi < vhi || hi == vhi && lo <= vlo
		code = []bpf.Instruction{hi, j(bpf.JumpGreaterOrEqual, vhi, 0, 3), j(bpf.JumpEqual, vhi, 0, F), lo, j(bpf.JumpGreaterThan, vlo, F, 0)}
	case opGT: // hi > vhi || hi == vhi && lo > vlo
		code = []bpf.Instruction{hi, j(bpf.JumpGreaterThan, vhi, 3, 0), j(bpf.JumpEqual, vhi, 0, F), lo, j(bpf.JumpGreaterThan, vlo, 0, F)}
	case opGE: // hi > vhi || hi == vhi && lo >= vlo
		code = []bpf.Instruction{hi, j(bpf.JumpGreaterThan, vhi, 3, 0), j(bpf.JumpEqual, vhi, 0, F), lo, j(bpf.JumpGreaterOrEqual, vlo, 0, F)}
	}
	var fails []int
	for i, ins := range code {
		if jf, ok := ins.(bpf.JumpIf); ok && (jf.SkipTrue == F || jf.SkipFalse == F) {
			fails = append(fails, i)
		}
	}
	return code, fails
}
