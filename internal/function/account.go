package function

import (
	"github.com/dsec-dev/dsec/internal/wasmopt"
	"github.com/tetratelabs/wazero/api"
)

// What an instance holds on the host for its declarations, beyond its
// linear memory, per item, as measured on wazero v1.12 (amd64), rounded up;
// TestFixedCosts measures them again. Instantiating allocates a Go slice
// per table (8 bytes an entry), an entry per element segment entry, and a
// value per global, import and data segment.
const (
	costTable       = 128
	costTableEntry  = 8
	costElemEntry   = 48
	costGlobal      = 96
	costImport      = 48
	costDataSegment = 96
)

// fixedBytes is the host memory an instance of a module declaring info
// holds for those declarations.
func fixedBytes(info wasmopt.Info) uint64 {
	return costTable*uint64(info.Tables) +
		costTableEntry*info.TableEntries +
		costElemEntry*info.ElemEntries +
		costGlobal*uint64(info.Globals) +
		costImport*uint64(info.Imports) +
		costDataSegment*uint64(info.DataSegments)
}

// stackReserve is the part of the room a memory.grow leaves to the stack,
// so that a program refused memory can still report it (Go's runtime
// prints "out of memory" and exits).
const stackReserve = 256 << 10

// account reaches the two globals through which a metered instance
// charges its call stack and table growth to the call's memory limit
// (wasmopt.Meter): the bytes charged for the frames on the stack, and the
// room left for them and for table growth. The host sets the room when a
// call binds the instance and takes linear memory growth out of it. The
// stack's global is looked up only when needed (a start function ran,
// memory grows, the call trapped), since every lookup costs the call path
// an allocation.
//
// It is used by the goroutine running the instance.
type account struct {
	mod   api.Module
	room  api.MutableGlobal
	stack api.MutableGlobal // nil until first needed
}

// newAccount finds a metered instance's room.
func newAccount(mod api.Module) (account, bool) {
	r, ok := mod.ExportedGlobal(wasmopt.RoomGlobal).(api.MutableGlobal)
	return account{mod: mod, room: r}, ok
}

func (a *account) stackGlobal() api.MutableGlobal {
	if a.stack == nil {
		a.stack, _ = a.mod.ExportedGlobal(wasmopt.StackGlobal).(api.MutableGlobal)
	}
	return a.stack
}

// taken is what the instance took out of its initial room before the
// call: table growth in a start function.
func (a *account) taken() uint64 {
	return wasmopt.InitialRoom - min(a.room.Get(), wasmopt.InitialRoom)
}

// start gives a call's room to the instance. ranStart says whether a
// start function ran, whose frame is still counted on the stack.
func (a *account) start(room uint64, ranStart bool) {
	if ranStart {
		a.stackGlobal().Set(0)
	}
	a.room.Set(room)
}

// take takes n bytes of linear memory growth out of the room, if that
// leaves stackReserve beyond the stack in use. A nil account (a memory
// not checked out) takes anything.
func (a *account) take(n uint64) bool {
	if a == nil {
		return true
	}
	room, stack := a.room.Get(), a.stackGlobal().Get()
	if stack > room || n > room-stack || room-stack-n < stackReserve {
		return false
	}
	a.room.Set(room - n)
	return true
}

// overflowed reports whether the call trapped on the room at a function's
// entry.
func (a *account) overflowed() bool { return a.stackGlobal().Get() == wasmopt.StackOverflow }
