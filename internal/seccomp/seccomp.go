package seccomp

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Options choose a filter. The zero value is the filter for a sandbox
// without capabilities on this machine's architecture.
type Options struct {
	// Caps are the capabilities the sandbox keeps ("CAP_NET_RAW" or
	// "NET_RAW"); Docker's rules gated on them are included, except those
	// DSec denies regardless (see the package doc). Default: none.
	Caps []string
	// Arch is a GOARCH: amd64 or arm64; default runtime.GOARCH.
	Arch string
}

// targets are the architectures filters are built for.
var targets = map[string]struct {
	info *arch.Info
	target
}{
	"amd64": {arch.X86_64, target{auditArch: 0xc000003e, x32: true}},   // AUDIT_ARCH_X86_64
	"arm64": {arch.AARCH64, target{auditArch: 0xc00000b7, x32: false}}, // AUDIT_ARCH_AARCH64
}

// cache holds compiled programs by key(opt); every sandbox with the same
// capabilities gets the same filter.
var cache sync.Map

// Program returns the compiled filter for opt as raw struct sock_filter
// entries (8 bytes each, native byte order), ready to send to the
// sandbox's setup code, which passes it to Install. It is built once per
// distinct Options; each call returns a fresh copy. It fails with an
// error wrapping errdefs.ErrNotSupported for another architecture.
func Program(opt Options) ([]byte, error) {
	goarch, caps, err := normalize(opt)
	if err != nil {
		return nil, err
	}
	key := goarch + ":" + strings.Join(caps, ",")
	if v, ok := cache.Load(key); ok {
		return slices.Clone(v.([]byte)), nil
	}
	insns, err := instructions(goarch, caps)
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(insns)
	if err != nil {
		return nil, fmt.Errorf("assembling the seccomp filter: %w", err)
	}
	b := make([]byte, 0, 8*len(raw))
	for _, r := range raw {
		b = binary.NativeEndian.AppendUint16(b, r.Op)
		b = append(b, r.Jt, r.Jf)
		b = binary.NativeEndian.AppendUint32(b, r.K)
	}
	v, _ := cache.LoadOrStore(key, b)
	return slices.Clone(v.([]byte)), nil
}

// normalize returns opt's architecture and its capabilities as sorted,
// unique CAP_ names.
func normalize(opt Options) (string, []string, error) {
	goarch := opt.Arch
	if goarch == "" {
		goarch = runtime.GOARCH
	}
	if _, ok := targets[goarch]; !ok {
		return "", nil, fmt.Errorf("seccomp filters for %s: %w", goarch, errdefs.ErrNotSupported)
	}
	caps := make([]string, 0, len(opt.Caps))
	for _, c := range opt.Caps {
		c = strings.ToUpper(c)
		if !strings.HasPrefix(c, "CAP_") {
			c = "CAP_" + c
		}
		caps = append(caps, c)
	}
	slices.Sort(caps)
	return goarch, slices.Compact(caps), nil
}

// instructions builds the filter for goarch and caps (as normalize
// returns them).
func instructions(goarch string, caps []string) ([]bpf.Instruction, error) {
	t := targets[goarch]
	rs, err := rules(t.info, goarch, caps)
	if err != nil {
		return nil, err
	}
	tg := t.target
	for nr := range t.info.SyscallNumbers {
		tg.maxNr = max(tg.maxNr, nr)
	}
	return assemble(tg, rs)
}

// Install sets no_new_privs on the calling process and installs prog (as
// Program returns it) as a seccomp filter on all its threads
// (SECCOMP_FILTER_FLAG_TSYNC). The sandbox's setup code calls it last,
// just before execve; the filter and no_new_privs pass to every
// descendant and cannot be removed.
func Install(prog []byte) error {
	return sys.InstallSeccompFilter(prog)
}
