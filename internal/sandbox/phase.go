package sandbox

import (
	"strconv"
	"strings"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// ParseUser reads a phase's user: "" or "root" (0:0), "uid" (gid the
// same) or "uid:gid".
func ParseUser(s string) (uid, gid uint32, err error) {
	if s == "" || s == "root" {
		return 0, 0, nil
	}
	bad := errdefs.New(errdefs.Invalid, api.CodeInvalidUser, "user %q: root, uid or uid:gid", s)
	us, gs, hasGid := strings.Cut(s, ":")
	u, err := strconv.ParseUint(us, 10, 31)
	if err != nil {
		return 0, 0, bad
	}
	g := u
	if hasGid {
		if g, err = strconv.ParseUint(gs, 10, 31); err != nil {
			return 0, 0, bad
		}
	}
	return uint32(u), uint32(g), nil
}

// WholeRootWritable reports whether p leaves the whole root writable
// (Writable omitted, or naming /).
func WholeRootWritable(p api.Phase) bool {
	if p.Writable == nil {
		return true
	}
	for _, w := range p.Writable {
		if w == "/" {
			return true
		}
	}
	return false
}

// CheckPhase checks a phase a sandbox of spec moves to: its
// capabilities must be among spec's (its most, fixed at its start), its
// executables well formed. Both are made canonical in p.
func CheckPhase(spec Spec, p *api.Phase) error {
	req := api.CreateSandboxRequest{Tier: spec.Tier, Capabilities: MaxCapabilities(spec), Phases: []api.Phase{*p}}
	if req.Capabilities == nil {
		req.Capabilities = []string{}
	}
	if err := CheckCapsAndExecutables(&req); err != nil {
		return err
	}
	*p = req.Phases[0]
	return nil
}

// GuestPhaseParts are the parts of a phase a VM tier's guest applies
// itself (api.IntegrityReport.GuestEnforced): the read-only root and
// writable paths, the commands' user and capabilities, and the end of
// the earlier phase's processes. The host applies the network.
func GuestPhaseParts() []string {
	return []string{"writable", "user", "capabilities", "processes"}
}
