// Command dsectools is the multi-call program behind the function tier's
// default image. It is built once for GOOS=wasip1 GOARCH=wasm and installed
// under every tool name (bin/echo.wasm, bin/cat.wasm, …); it picks the tool
// from the base name of argv[0], minus ".wasm". One binary means one
// compiled module and one instance pool for every tool.
//
// Tools: echo, cat, wc, calc, json, env, exit, sleep, yes, ls, write,
// sha256sum, alloc. Three more, counter, openat and symlink, exist for the
// runtime's own tests and are not installed under their names.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// tool runs with the arguments after argv[0] and returns the exit code.
type tool func(args []string) int

var tools = map[string]tool{
	"echo":      echo,
	"cat":       cat,
	"wc":        wc,
	"calc":      calc,
	"json":      jsonTool,
	"env":       env,
	"exit":      exit,
	"sleep":     sleep,
	"yes":       yes,
	"ls":        ls,
	"write":     write,
	"sha256sum": sha256sum,
	"alloc":     alloc,
	"counter":   counter,
	"openat":    openat,
	"symlink":   symlink,
}

func main() {
	name := "dsectools"
	if len(os.Args) > 0 {
		name = strings.TrimSuffix(filepath.Base(os.Args[0]), ".wasm")
	}
	args := os.Args[1:]
	if name == "dsectools" && len(args) > 0 {
		name, args = args[0], args[1:]
	}
	t, ok := tools[name]
	if !ok {
		names := make([]string, 0, len(tools))
		for n := range tools {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "dsectools: unknown tool %q (tools: %s)\n", name, strings.Join(names, " "))
		os.Exit(127)
	}
	os.Exit(t(args))
}

// fail prints a message for tool name on stderr and returns code.
func fail(name string, code int, format string, args ...any) int {
	fmt.Fprintf(os.Stderr, name+": "+format+"\n", args...)
	return code
}
