// Package cleanup is a stack of undo steps for work that is built in
// stages (a daemon's components, a half-created sandbox): if a later stage
// fails, Clean undoes the earlier ones in reverse order; once everything
// succeeded, Release keeps them.
//
//	var cu cleanup.Stack
//	defer cu.Clean()
//	…; cu.Add(func() { undo() })
//	cu.Release()
package cleanup

// Stack holds undo steps. It is not safe for concurrent use.
type Stack struct {
	steps []func()
}

// Add pushes an undo step.
func (s *Stack) Add(f func()) { s.steps = append(s.steps, f) }

// Clean runs the steps in reverse order and empties the stack.
func (s *Stack) Clean() {
	for i := len(s.steps) - 1; i >= 0; i-- {
		s.steps[i]()
	}
	s.steps = nil
}

// Release forgets the steps: what was built is kept.
func (s *Stack) Release() { s.steps = nil }

// Take moves the steps into a new stack (to run later, e.g. at shutdown)
// and empties s.
func (s *Stack) Take() *Stack {
	out := &Stack{steps: s.steps}
	s.steps = nil
	return out
}
