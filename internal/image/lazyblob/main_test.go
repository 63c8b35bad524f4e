package lazyblob

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
)

// mappedEnv makes the test binary a helper that maps a file and checks
// its digest (see checkMapped), instead of running the tests.
const mappedEnv = "DSEC_LAZYBLOB_TEST_MAPPED"

func TestMain(m *testing.M) {
	if p := os.Getenv(mappedEnv); p != "" {
		os.Exit(mappedRole(p, os.Getenv(mappedEnv+"_SHA256"), os.Getenv(mappedEnv+"_LEN")))
	}
	os.Exit(m.Run())
}

// mappedRole maps n bytes of the file at p and prints "ok" if their
// SHA-256 is want. It runs in a process of its own: a page fault on a
// file whose FUSE server is in the same process can deadlock it (the
// faulting thread sits in the kernel until the server answers, and a
// garbage collection that starts meanwhile stops the server's goroutines
// while it waits for that thread).
func mappedRole(p, want, n string) int {
	size, err := strconv.Atoi(n)
	if err != nil {
		fmt.Println("bad length:", err)
		return 2
	}
	f, err := os.Open(p)
	if err != nil {
		fmt.Println(err)
		return 2
	}
	defer f.Close()
	m, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		fmt.Println("mapping:", err)
		return 2
	}
	defer syscall.Munmap(m)
	sum := sha256.Sum256(m)
	if hex.EncodeToString(sum[:]) != want {
		fmt.Println("mismatch")
		return 1
	}
	fmt.Println("ok")
	return 0
}
