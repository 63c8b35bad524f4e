package testenv

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// WantError fails the test unless err has class and code.
func WantError(t testing.TB, err error, class errdefs.Class, code string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %s/%s", class, code)
	}
	if !errors.Is(err, class) || errdefs.CodeOf(err) != code {
		t.Fatalf("error %q is %s/%s, want %s/%s", err, errdefs.ClassOf(err), errdefs.CodeOf(err), class, code)
	}
}

// RandBytes returns n pseudo-random bytes fixed by seed: incompressible,
// and no two blocks of them alike.
func RandBytes(seed uint64, n int) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	b := make([]byte, n)
	rand.NewChaCha8(key).Read(b)
	return b
}
