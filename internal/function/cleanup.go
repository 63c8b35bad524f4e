package function

// cleanups is a stack of undo steps for a multi-step construction: Clean
// runs them in reverse unless Release was called first.
type cleanups struct {
	fns []func()
}

func (c *cleanups) add(fn func()) { c.fns = append(c.fns, fn) }

// release keeps what was built.
func (c *cleanups) release() { c.fns = nil }

// clean undoes what was built, last step first.
func (c *cleanups) clean() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns = nil
}
