package sys

import (
	"bufio"
	"os"
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

// MountInfoUnder returns the mounts at or below dir from the process's
// mount table, in table order (parents before the mounts stacked on or
// below them).
func MountInfoUnder(dir string) ([]MountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []MountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20) // overlay lines can be long
	for sc.Scan() {
		// id parent maj:min root target opts [optional…] - fstype source superopts
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp != dir && !strings.HasPrefix(mp, dir+"/") {
			continue
		}
		e := MountEntry{Target: mp}
		for i := 5; i < len(fields); i++ {
			if fields[i] == "-" {
				rest := fields[i+1:]
				if len(rest) > 0 {
					e.FSType = rest[0]
				}
				if len(rest) > 1 {
					e.Source = unescapeMount(rest[1])
				}
				if len(rest) > 2 {
					e.Options = unescapeMount(rest[2])
				}
				break
			}
		}
		out = append(out, e)
	}
	return out, sc.Err()
}
