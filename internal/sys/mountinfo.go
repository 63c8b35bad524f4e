package sys

import (
	"fmt"
	"strings"
)

// MountEntry is one line of /proc/self/mountinfo.
type MountEntry struct {
	Target string // the mount point
	FSType string // e.g. "erofs", "overlay"
	Source string // e.g. the image file of a file-backed erofs mount
	// Options are the superblock options (for overlay: lowerdir=…,
	// upperdir=…, workdir=…).
	Options string
}

// unescapeMount undoes the octal escapes (\040 for space…) of mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
