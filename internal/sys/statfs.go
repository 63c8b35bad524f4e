package sys

// FSUsage is what statfs says of a file system.
type FSUsage struct {
	Used, Size, Free int64 // bytes
	FreeInodes       uint64
}

// Full reports whether the file system has no room for another file or
// block worth having (tmpfs leaves a partial page free when writes fail).
func (u FSUsage) Full() bool { return u.Free < 64<<10 || u.FreeInodes == 0 }
