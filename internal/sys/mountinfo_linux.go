package sys

import (
	"bufio"
	"os"
	"strings"
)

// MountsUnder returns the mount points at or below dir, from the
// process's mount table, in table order.
func MountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out, sc.Err()
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
