// Package tiny holds hand-written WebAssembly modules for the function
// tier's default image: echo (copies stdin to stdout), trap (executes
// unreachable) and loop (spins forever). The .wasm files are generated from
// the .wat sources next to them and committed; tiny_test.go checks that
// they match when wat2wasm is installed.
package tiny

import _ "embed"

//go:generate wat2wasm echo.wat -o echo.wasm
//go:generate wat2wasm trap.wat -o trap.wasm
//go:generate wat2wasm loop.wat -o loop.wasm

var (
	//go:embed echo.wasm
	echo []byte
	//go:embed trap.wasm
	trap []byte
	//go:embed loop.wasm
	loop []byte
)

// Modules maps the image name of each module (bin/<name>.wasm) to its
// source name in this directory.
var Modules = map[string]string{
	"tiny-echo": "echo",
	"trap":      "trap",
	"loop":      "loop",
}

// Bytes returns a copy of the compiled module with the given source name
// ("echo", "trap", "loop"), or nil if there is none.
func Bytes(source string) []byte {
	var b []byte
	switch source {
	case "echo":
		b = echo
	case "trap":
		b = trap
	case "loop":
		b = loop
	default:
		return nil
	}
	return append([]byte(nil), b...)
}
