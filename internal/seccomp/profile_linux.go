package seccomp

import moby "github.com/moby/profiles/seccomp"

// dockerDefault returns Docker's default profile (moby builds it on Linux
// only).
func dockerDefault() (*moby.Seccomp, error) { return moby.DefaultProfile(), nil }
