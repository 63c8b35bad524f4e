package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// exit exits with the code given (default 0).
func exit(args []string) int {
	if len(args) == 0 {
		return 0
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 0 || n > 255 {
		return fail("exit", 2, "bad exit code %q", args[0])
	}
	return n
}

// sleep sleeps for a (fractional) number of seconds.
func sleep(args []string) int {
	if len(args) != 1 {
		return fail("sleep", 2, "usage: sleep SECONDS")
	}
	s, err := strconv.ParseFloat(args[0], 64)
	if err != nil || s < 0 {
		return fail("sleep", 2, "bad duration %q", args[0])
	}
	time.Sleep(time.Duration(s * float64(time.Second)))
	return 0
}

// sink keeps alloc's memory reachable so the compiler cannot drop it.
var sink []byte

// alloc allocates and touches N MiB. If the memory cannot be had, the Go
// runtime dies with "out of memory" and exit code 2.
func alloc(args []string) int {
	if len(args) != 1 {
		return fail("alloc", 2, "usage: alloc MiB")
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 0 {
		return fail("alloc", 2, "bad size %q", args[0])
	}
	sink = make([]byte, n<<20)
	for i := 0; i < len(sink); i += 4096 {
		sink[i] = 1
	}
	fmt.Printf("allocated %d MiB\n", n)
	return 0
}

// Process state for counter: a package variable, a 1 MiB array in the
// data segment's zero part, and a 32 MiB heap block.
var (
	calls   int
	scratch [1 << 20]byte
)

// counter is a test tool for the stateless tier: it increments a package
// variable and prints it, and dirties memory after checking it is clean:
// a 1 MiB array and, unless its argument is "small", a 32 MiB heap block.
// In a fresh instance it always prints 1.
func counter(args []string) int {
	calls++
	dirty := false
	for i := 0; i < len(scratch); i += 4096 {
		if scratch[i] != 0 {
			dirty = true
		}
		scratch[i] = 0xff
	}
	if len(args) == 0 || args[0] != "small" {
		big := make([]byte, 32<<20)
		for i := 0; i < len(big); i += 4096 {
			if big[i] != 0 {
				dirty = true
			}
			big[i] = 0xff
		}
		sink = big
	}
	if dirty {
		fmt.Println(calls, "dirty")
		return 1
	}
	fmt.Println(calls)
	return 0
}

// symlink is a test tool: symlink TARGET LINK.
func symlink(args []string) int {
	if len(args) != 2 {
		return fail("symlink", 2, "usage: symlink TARGET LINK")
	}
	if err := os.Symlink(args[0], args[1]); err != nil {
		return fail("symlink", 1, "%v", err)
	}
	return 0
}

// openat is a test tool: it opens a path relative to a preopened directory
// descriptor without the path cleaning os.Open does, and prints the file.
func openat(args []string) int {
	if len(args) != 2 {
		return fail("openat", 2, "usage: openat FD PATH")
	}
	fd, err := strconv.Atoi(args[0])
	if err != nil {
		return fail("openat", 2, "bad fd %q", args[0])
	}
	f, err := openRaw(fd, args[1])
	if err != nil {
		return fail("openat", 1, "%s: %v", args[1], err)
	}
	defer f.Close()
	if _, err := io.Copy(os.Stdout, f); err != nil {
		return fail("openat", 1, "%s: %v", args[1], err)
	}
	return 0
}
