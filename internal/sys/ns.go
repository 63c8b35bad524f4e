package sys

// Bind is a path of the host kept in a small mount namespace (see
// EnterSmallMountNS), at the same path; Recursive takes its submounts too.
type Bind struct {
	Path      string
	Recursive bool
}
