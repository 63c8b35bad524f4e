package container

import "github.com/dsec-dev/dsec/internal/sandbox"

// Files implements sandbox.Sandbox: the agent serves them, confined to the
// sandbox's root; a path leading out of it is refused and recorded
// (refused).
func (s *Sandbox) Files() sandbox.Files { return s.agent.Files(s.refused) }
