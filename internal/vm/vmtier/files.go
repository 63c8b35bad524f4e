package vmtier

import "github.com/dsec-dev/dsec/internal/sandbox"

// Files implements sandbox.Sandbox: the guest's agent serves them, over
// the guest's whole root.
func (s *Sandbox) Files() sandbox.Files { return s.agent.Files(nil) }
