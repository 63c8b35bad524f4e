package sys

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MountErofs mounts the EROFS metadata image meta on target, read-only,
// nosuid and nodev, with blob as its extra device. It is a direct
// mount(2) of the file: no loop device (util-linux mount would add one).
func MountErofs(meta, blob, target string) error {
	opts := ""
	if blob != "" {
		opts = "device=" + blob
	}
	if err := unix.Mount(meta, target, "erofs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mounting erofs %s on %s: %w", meta, target, err)
	}
	return nil
}

// MountOverlay mounts an overlay on target. lowers are listed top first.
// With upper empty the overlay is read-only; otherwise upper and work
// (on the same file system) take the writes. Always nosuid and nodev.
func MountOverlay(target string, lowers []string, upper, work string) error {
	for _, l := range lowers {
		if strings.ContainsAny(l, ":,") {
			return fmt.Errorf("overlay lower %q contains ':' or ','", l)
		}
	}
	opts := "lowerdir=" + strings.Join(lowers, ":")
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if upper != "" {
		opts += ",upperdir=" + upper + ",workdir=" + work
	} else {
		flags |= unix.MS_RDONLY
		if len(lowers) == 1 {
			// overlay needs two lowers without an upper; a single read-only
			// layer is served by its own mount instead.
			return fmt.Errorf("a read-only overlay needs at least two lowers")
		}
	}
	if err := unix.Mount("overlay", target, "overlay", flags, opts); err != nil {
		return fmt.Errorf("mounting overlay on %s: %w", target, err)
	}
	return nil
}

// MountOverlayByFD is MountOverlay (with an upper), but the directories
// reach the kernel as /proc/self/fd/N of descriptors open for the call.
// The kernel keeps an overlay's options as they were given and shows
// them in /proc/<pid>/mountinfo to every process that sees the mount:
// given as paths, a sandbox's root showed the node's data directory to
// the sandbox (the layer cache's and the state directory's paths).
func MountOverlayByFD(target string, lowers []string, upper, work string) error {
	var names []string
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, d := range append(append([]string{}, lowers...), upper, work) {
		fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("mounting overlay on %s: opening %s: %w", target, d, err)
		}
		fds = append(fds, fd)
		names = append(names, "/proc/self/fd/"+strconv.Itoa(fd))
	}
	n := len(lowers)
	return MountOverlay(target, names[:n], names[n], names[n+1])
}

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
