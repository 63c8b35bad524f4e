package sys

// UnbindableError is ReplaceWritable's error for a new writable path
// that cannot be bound (it must resolve from the root without symlinks
// and without leaving the root mount); the earlier binds are back.
type UnbindableError struct {
	Path string
	Err  error
}

func (e *UnbindableError) Error() string { return e.Path + ": " + e.Err.Error() }

func (e *UnbindableError) Unwrap() error { return e.Err }
