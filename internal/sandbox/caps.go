package sandbox

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Capabilities a task may grant its commands (api.CreateSandboxRequest
// and api.Phase Capabilities), by number. Each is either harmless inside
// the sandbox's user namespace or what a root setup step needs (package
// managers chown, override permissions, change users). Never grantable:
// SYS_ADMIN, SYS_MODULE, SYS_PTRACE, SYS_RAWIO, SYS_BOOT, SYS_TIME,
// SYS_PACCT, SYS_TTY_CONFIG, MAC_*, BPF, PERFMON, NET_ADMIN, NET_RAW,
// SYSLOG, SETPCAP, SETFCAP, MKNOD, AUDIT_*, LINUX_IMMUTABLE,
// CHECKPOINT_RESTORE, DAC_READ_SEARCH (the seccomp profile opens
// open_by_handle_at to it) and those the kernel checks in the host's
// user namespace, where a sandbox never holds them, so that granting
// them would only mislead (SYS_NICE, SYS_RESOURCE, IPC_LOCK, LEASE,
// WAKE_ALARM, BLOCK_SUSPEND).
var grantable = map[string]int{
	"CAP_CHOWN":            0,
	"CAP_DAC_OVERRIDE":     1,
	"CAP_FOWNER":           3,
	"CAP_FSETID":           4,
	"CAP_KILL":             5,
	"CAP_SETGID":           6,
	"CAP_SETUID":           7,
	"CAP_NET_BIND_SERVICE": 10,
	"CAP_IPC_OWNER":        15,
	"CAP_SYS_CHROOT":       18,
}

// GrantableCapabilities lists the capabilities a task may grant, sorted.
func GrantableCapabilities() []string {
	out := make([]string, 0, len(grantable))
	for n := range grantable {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// CapabilityNumber returns the number of a grantable capability in
// canonical form ("CAP_NET_BIND_SERVICE").
func CapabilityNumber(name string) (int, bool) {
	n, ok := grantable[name]
	return n, ok
}

// NormalizeCapabilities checks names ("CAP_NET_BIND_SERVICE" or
// "net_bind_service", any case) against the grantable ones and returns
// them canonical, sorted and without duplicates; nil stays nil. A name
// that is not grantable is an Invalid error, code invalid_capability.
func NormalizeCapabilities(names []string) ([]string, error) {
	if names == nil {
		return nil, nil
	}
	out := make([]string, 0, len(names))
	for _, n := range names {
		c := strings.ToUpper(strings.TrimSpace(n))
		if !strings.HasPrefix(c, "CAP_") {
			c = "CAP_" + c
		}
		if _, ok := grantable[c]; !ok {
			return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidCapability,
				"capability %q cannot be granted; grantable: %s", n, strings.Join(GrantableCapabilities(), ", "))
		}
		out = append(out, c)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// MaxCapabilities is the most any command of spec may hold: its
// Capabilities, or, if it names none, the union of its phases'.
func MaxCapabilities(spec Spec) []string {
	if spec.Capabilities != nil {
		return spec.Capabilities
	}
	var all []string
	for _, p := range spec.Phases {
		all = append(all, p.Capabilities...)
	}
	slices.Sort(all)
	return slices.Compact(all)
}

// CommandCapabilities are the capabilities of the commands of phase p
// of spec: the phase's, or without phases (p nil) the sandbox's.
func CommandCapabilities(spec Spec, p *api.Phase) []string {
	if p != nil {
		return p.Capabilities
	}
	return spec.Capabilities
}

// maxExecutables bounds a phase's executables.
const maxExecutables = 256

// NormalizeExecutables checks a phase's executables: absolute paths of
// at most 255 bytes, each a file, a directory followed by "/*" (every
// file directly in it) or a directory followed by "/**" (every file below
// it, at any depth); no other pattern. nil stays nil (any program may
// run). Bad entries are Invalid, code invalid_executable, and the message
// says what is wrong.
func NormalizeExecutables(list []string) ([]string, error) {
	if list == nil {
		return nil, nil
	}
	if len(list) > maxExecutables {
		return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidExecutable, "at most %d executables", maxExecutables)
	}
	out := make([]string, 0, len(list))
	for _, e := range list {
		bad := func(why string) error {
			return errdefs.New(errdefs.Invalid, api.CodeInvalidExecutable, "executable %q: %s", e, why)
		}
		if !path.IsAbs(e) || strings.ContainsRune(e, 0) || len(e) > 255 {
			return nil, bad("absolute paths of at most 255 bytes")
		}
		body, suffix := e, ""
		for _, s := range []string{"/**", "/*"} {
			if dir, ok := strings.CutSuffix(e, s); ok {
				body, suffix = dir, s
				break
			}
		}
		if suffix != "" && path.Clean("/"+body) == "/" {
			return nil, bad(fmt.Sprintf("%q would allow every program; name the directories", "/"+suffix[1:]))
		}
		if strings.ContainsAny(body, "*?[]\\") {
			return nil, bad("the only patterns are a trailing /* (every file directly in a directory) and /** (every file below it)")
		}
		c := path.Clean(body)
		if c == "/" {
			return nil, bad("not a file")
		}
		out = append(out, c+suffix)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// CheckCapsAndExecutables checks and normalises the capabilities and
// executables of a create request (in place): names grantable, every
// phase's capabilities among the sandbox's (when it names them),
// executables well formed; the function tier has no capabilities.
func CheckCapsAndExecutables(req *api.CreateSandboxRequest) error {
	var err error
	if req.Capabilities, err = NormalizeCapabilities(req.Capabilities); err != nil {
		return err
	}
	noCaps := func(c []string, what string) error {
		if len(c) > 0 && req.Tier == api.TierFunction {
			return errdefs.New(errdefs.Unsupported, api.CodeTierHasNoCapabilities, "%s: the function tier runs WebAssembly, which has no capabilities", what)
		}
		return nil
	}
	if err := noCaps(req.Capabilities, "capabilities"); err != nil {
		return err
	}
	for i := range req.Phases {
		p := &req.Phases[i]
		if p.Capabilities, err = NormalizeCapabilities(p.Capabilities); err != nil {
			return errdefs.Within(errdefs.Invalid, api.CodeInvalidCapability, err, "phase %s", p.Name)
		}
		if err := noCaps(p.Capabilities, "phase "+p.Name); err != nil {
			return err
		}
		if req.Capabilities != nil {
			for _, c := range p.Capabilities {
				if !slices.Contains(req.Capabilities, c) {
					return errdefs.New(errdefs.Invalid, api.CodeCapabilityNotInSandbox,
						"phase %s: %s is not among the sandbox's capabilities %v", p.Name, c, req.Capabilities)
				}
			}
		}
		if p.Executables, err = NormalizeExecutables(p.Executables); err != nil {
			return errdefs.Within(errdefs.Invalid, api.CodeInvalidExecutable, err, "phase %s", p.Name)
		}
	}
	return nil
}

// ExecutableAllowed reports whether the clean absolute path p is one of
// list's (see NormalizeExecutables): nil allows everything.
func ExecutableAllowed(list []string, p string) bool {
	if list == nil {
		return true
	}
	for _, e := range list {
		if dir, ok := strings.CutSuffix(e, "/**"); ok {
			if strings.HasPrefix(p, dir+"/") {
				return true
			}
		} else if dir, ok := strings.CutSuffix(e, "/*"); ok {
			if path.Dir(p) == dir {
				return true
			}
		} else if e == p {
			return true
		}
	}
	return false
}
