package function

import (
	"context"
	"encoding/binary"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// wazero binds WASI args and environment when a module is instantiated,
// but pooled instances are instantiated before their call is known. So the
// runtime's wasi_snapshot_preview1 is wazero's, with the four functions
// that read args and environment replaced by ones that read them from the
// context of the call running _start.

// callKey is the context key of a call's *callArgs.
type callKey struct{}

// callArgs are the argument and environment vectors of one call, encoded
// as WASI wants them: NUL-terminated, with their total size.
type callArgs struct {
	args, env         [][]byte
	argsSize, envSize uint32
}

func newCallArgs(args, env []string) *callArgs {
	c := &callArgs{}
	c.args, c.argsSize = encodeStrings(args)
	c.env, c.envSize = encodeStrings(env)
	return c
}

func encodeStrings(ss []string) ([][]byte, uint32) {
	out := make([][]byte, len(ss))
	var size uint32
	for i, s := range ss {
		out[i] = []byte(s)
		size += uint32(len(s)) + 1
	}
	return out, size
}

func callArgsOf(ctx context.Context) *callArgs {
	if c, ok := ctx.Value(callKey{}).(*callArgs); ok {
		return c
	}
	return &callArgs{}
}

// WASI errno values (wasi_snapshot_preview1).
const (
	errnoSuccess = 0
	errnoFault   = 21
)

func instantiateWASI(ctx context.Context, r wazero.Runtime) error {
	b := r.NewHostModuleBuilder(wasi_snapshot_preview1.ModuleName)
	wasi_snapshot_preview1.NewFunctionExporter().ExportFunctions(b)
	i32 := api.ValueTypeI32
	params, results := []api.ValueType{i32, i32}, []api.ValueType{i32}
	export := func(name string, fn api.GoModuleFunc, p1, p2 string) {
		b.NewFunctionBuilder().WithGoModuleFunction(fn, params, results).
			WithParameterNames(p1, p2).WithResultNames("errno").Export(name)
	}
	export("args_get", func(ctx context.Context, mod api.Module, stack []uint64) {
		c := callArgsOf(ctx)
		stack[0] = writeVector(mod.Memory(), c.args, c.argsSize, uint32(stack[0]), uint32(stack[1]))
	}, "argv", "argv_buf")
	export("args_sizes_get", func(ctx context.Context, mod api.Module, stack []uint64) {
		c := callArgsOf(ctx)
		stack[0] = writeSizes(mod.Memory(), len(c.args), c.argsSize, uint32(stack[0]), uint32(stack[1]))
	}, "result.argc", "result.argv_len")
	export("environ_get", func(ctx context.Context, mod api.Module, stack []uint64) {
		c := callArgsOf(ctx)
		stack[0] = writeVector(mod.Memory(), c.env, c.envSize, uint32(stack[0]), uint32(stack[1]))
	}, "environ", "environ_buf")
	export("environ_sizes_get", func(ctx context.Context, mod api.Module, stack []uint64) {
		c := callArgsOf(ctx)
		stack[0] = writeSizes(mod.Memory(), len(c.env), c.envSize, uint32(stack[0]), uint32(stack[1]))
	}, "result.environc", "result.environ_len")
	_, err := b.Instantiate(ctx)
	return err
}

// writeVector writes the pointers to values at offsets and the values,
// NUL-terminated, at buf.
func writeVector(mem api.Memory, values [][]byte, size, offsets, buf uint32) uint64 {
	if mem == nil {
		return errnoFault
	}
	ptrs, ok := mem.Read(offsets, uint32(len(values))*4)
	if !ok {
		return errnoFault
	}
	data, ok := mem.Read(buf, size)
	if !ok {
		return errnoFault
	}
	var at uint32
	for i, v := range values {
		binary.LittleEndian.PutUint32(ptrs[i*4:], buf+at)
		copy(data[at:], v)
		at += uint32(len(v))
		data[at] = 0
		at++
	}
	return errnoSuccess
}

func writeSizes(mem api.Memory, count int, size, countAt, sizeAt uint32) uint64 {
	if mem == nil || !mem.WriteUint32Le(countAt, uint32(count)) || !mem.WriteUint32Le(sizeAt, size) {
		return errnoFault
	}
	return errnoSuccess
}
