package audit

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/dsec-dev/dsec/internal/monitor"
)

// Rules are data: rules.json (embedded) holds the defaults, and an
// operator adds or replaces rules (by name) with a file of the same
// shape ([audit] rules). A monitor event that matches a rule becomes an
// audit event with the rule's name and severity; one that matches none
// is kept with severity "info".

//go:embed rules.json
var defaultRules []byte

// Rule is one named pattern of monitor events.
type Rule struct {
	Name        string `json:"name"`
	Severity    string `json:"severity"`
	Description string `json:"description"`
	// Refs are the security catalogue's attacks and reward hacks the
	// rule watches for (A1–A64, R1–R17: docs/adversarial.md, "The catalogue").
	Refs  []string `json:"refs,omitempty"`
	Match Match    `json:"match"`
}

// Match is what an event must have, every field given (empty: any).
type Match struct {
	// Kind is an event kind (monitor.Kind…): "exec", "syscall",
	// "oom-kill", or one the node reports ("phase-kill", "destroy-kill",
	// "file-api", "output-capped", "call-timeout", "memory-limit",
	// "sandbox-ended").
	Kind     string   `json:"kind,omitempty"`
	Syscalls []string `json:"syscalls,omitempty"`
	// Paths are patterns of the event's path or target (a rename's or
	// link's new name): "*" matches within a path element, "**" any
	// number of elements.
	Paths []string `json:"paths,omitempty"`
	// CIDRs contain a connect's destination.
	CIDRs []string `json:"cidrs,omitempty"`
	// Arg0 lists values of the call's first argument (socket's family,
	// kill's pid), a C int: compared as the kernel reads it, its
	// register's lower 32 bits sign-extended (-1 is 18446744073709551615
	// however the caller extended it).
	Arg0 []uint64 `json:"arg0,omitempty"`
	// ArgvAny lists words one of which an exec's arguments must contain.
	ArgvAny []string `json:"argv_any,omitempty"`
	// ModeBits, if not 0, requires the call's mode argument (chmod's,
	// fchmodat's, mknod's… see modeArg) to have one of these bits: 06000
	// the setuid and setgid bits, 020000 a character or block device.
	ModeBits uint64 `json:"mode_bits,omitempty"`
	// Ports lists destination ports of a connect.
	Ports []uint16 `json:"ports,omitempty"`
	// Errno lists errors the call must have returned (28 ENOSPC…).
	Errno []int64 `json:"errno,omitempty"`
	// Denied, if set, requires the call to have been refused (true) or
	// allowed (false).
	Denied *bool `json:"denied,omitempty"`

	prefixes []netip.Prefix
}

var severities = []string{"low", "medium", "high", "critical"}

// LoadRules returns the default rules with those of file (if not "")
// added, a rule of the same name replacing the default one.
func LoadRules(file string) ([]Rule, error) {
	rules, err := parseRules(defaultRules, "the default rules")
	if err != nil {
		return nil, err
	}
	if file == "" {
		return rules, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("audit rules: %w", err)
	}
	more, err := parseRules(b, file)
	if err != nil {
		return nil, err
	}
	for _, r := range more {
		if i := slices.IndexFunc(rules, func(d Rule) bool { return d.Name == r.Name }); i >= 0 {
			rules[i] = r
		} else {
			rules = append(rules, r)
		}
	}
	return rules, nil
}

func parseRules(b []byte, what string) ([]Rule, error) {
	var rules []Rule
	if err := json.Unmarshal(b, &rules); err != nil {
		return nil, fmt.Errorf("audit rules in %s: %w", what, err)
	}
	names := map[string]bool{}
	for i := range rules {
		r := &rules[i]
		if r.Name == "" || !slices.Contains(severities, r.Severity) {
			return nil, fmt.Errorf("audit rules in %s: rule %d needs a name and a severity (%s)", what, i, strings.Join(severities, ", "))
		}
		if names[r.Name] {
			return nil, fmt.Errorf("audit rules in %s: two rules named %s", what, r.Name)
		}
		names[r.Name] = true
		for _, ref := range r.Refs {
			if !validRef(ref) {
				return nil, fmt.Errorf("audit rule %s: %q is no catalogue entry (A1–A64, R1–R17)", r.Name, ref)
			}
		}
		for _, c := range r.Match.CIDRs {
			p, err := netip.ParsePrefix(c)
			if err != nil {
				return nil, fmt.Errorf("audit rule %s: %w", r.Name, err)
			}
			r.Match.prefixes = append(r.Match.prefixes, p)
		}
		for _, p := range r.Match.Paths {
			if _, err := path.Match(strings.ReplaceAll(p, "**", "*"), ""); err != nil {
				return nil, fmt.Errorf("audit rule %s: path %q: %w", r.Name, p, err)
			}
		}
	}
	return rules, nil
}

// validRef reports whether ref names an entry of the security catalogue:
// an attack A1–A64 or a reward hack R1–R17.
func validRef(ref string) bool {
	if len(ref) < 2 {
		return false
	}
	n, err := strconv.Atoi(ref[1:])
	if err != nil || ref[1] == '0' || ref[1] == '+' || ref[1] == '-' {
		return false
	}
	switch ref[0] {
	case 'A':
		return n >= 1 && n <= 64
	case 'R':
		return n >= 1 && n <= 17
	}
	return false
}

// Matches reports whether e matches the rule.
func (r *Rule) Matches(e monitor.Event) bool {
	m := &r.Match
	switch {
	case m.Kind != "" && m.Kind != e.Kind,
		len(m.Syscalls) > 0 && !slices.Contains(m.Syscalls, e.Syscall),
		len(m.Arg0) > 0 && !slices.Contains(m.Arg0, uint64(int64(int32(e.Args[0])))),
		len(m.ArgvAny) > 0 && !slices.ContainsFunc(e.Argv, func(a string) bool { return slices.Contains(m.ArgvAny, a) }),
		m.Denied != nil && *m.Denied != e.Denied(),
		len(m.Errno) > 0 && !slices.Contains(m.Errno, -e.Ret),
		len(m.Ports) > 0 && (!e.Addr.IsValid() || !slices.Contains(m.Ports, e.Addr.Port())):
		return false
	}
	if m.ModeBits != 0 {
		i, ok := modeArg[e.Syscall]
		if !ok || e.Kind != monitor.KindSyscall || e.Args[i]&m.ModeBits == 0 {
			return false
		}
	}
	if len(m.prefixes) > 0 {
		a := e.Addr.Addr().Unmap()
		if !a.IsValid() || !slices.ContainsFunc(m.prefixes, func(p netip.Prefix) bool { return p.Contains(a) }) {
			return false
		}
	}
	if len(m.Paths) > 0 && !slices.ContainsFunc(m.Paths, func(p string) bool { return matchPath(p, e.Path) || matchPath(p, e.Target) }) {
		return false
	}
	return true
}

// modeArg is the index of the mode argument of the calls that have one.
var modeArg = map[string]int{"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "mknod": 1, "mknodat": 2}

// matchPath matches name against pattern, "**" spanning any number of
// path elements (none included).
func matchPath(pattern, name string) bool {
	if name == "" {
		return false
	}
	return matchParts(strings.Split(pattern, "/"), strings.Split(name, "/"))
}

func matchParts(pat, name []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for i := 0; i <= len(name); i++ {
				if matchParts(pat[1:], name[i:]) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], name[0]); !ok {
			return false
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0
}

// NodeRule is the rule of connects to the node itself or its sandbox
// network (the gateway, other sandboxes): the node's API, control plane
// and NATS listen there. Its prefixes depend on the node, so it is made
// at start rather than kept in rules.json; it goes before the defaults
// (whose private-connect would name a private node address less
// precisely).
func NodeRule(prefixes []netip.Prefix) Rule {
	r := Rule{Name: "node-connect", Severity: "critical",
		Description: "a connect to the node's own addresses or its sandbox network (the API, control plane, NATS, other sandboxes: A32, A33, A34, R9)",
		Refs:        []string{"A32", "A33", "A34", "R9"}}
	r.Match.Syscalls = []string{"connect"}
	for _, p := range prefixes {
		r.Match.CIDRs = append(r.Match.CIDRs, p.String())
		r.Match.prefixes = append(r.Match.prefixes, p.Masked())
	}
	return r
}
