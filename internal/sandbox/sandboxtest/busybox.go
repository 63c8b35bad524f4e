package sandboxtest

import "strconv"

// Busybox are the suite's programs in the busybox image, for the tiers
// that run it (container, microvm, vm).
var Busybox = Commands{
	Echo:      func(args ...string) []string { return append([]string{"echo"}, args...) },
	Cat:       func() []string { return []string{"cat"} },
	Env:       func() []string { return []string{"env"} },
	Exit:      func(code int) []string { return Sh("exit " + strconv.Itoa(code)) },
	Sleep:     func(s int) []string { return []string{"sleep", strconv.Itoa(s)} },
	Flood:     func() []string { return []string{"yes"} },
	ReadFile:  func(p string) []string { return []string{"cat", "--", p} },
	WriteFile: func(p string) []string { return Sh(`exec cat > "$1"`, p) },
	MkFifo:    func(p string) []string { return []string{"mkfifo", "--", p} },
	// A shell variable of mb MiB: the shell touches every byte of it.
	AllocMB: func(mb int) []string {
		return Sh(`x=$(head -c "$1"m /dev/zero | tr '\0' a) && test ${#x} -gt 0`, strconv.Itoa(mb))
	},
}

// Sh is script run by /bin/sh -c with args as $1….
func Sh(script string, args ...string) []string {
	return append([]string{"/bin/sh", "-c", script, "sh"}, args...)
}
