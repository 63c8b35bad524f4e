package vmm

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// cappedLog is a log file that never holds more than max bytes on disk:
// it writes path until it reaches max/2, then renames it to path.1
// (replacing the previous one) and starts a new path. A guest that floods
// its console (catalogue A44) costs the host at most max bytes and the
// copy's CPU; the latest output is always kept. It is not safe for
// concurrent use.
type cappedLog struct {
	path string
	half int64
	f    *os.File
	n    int64 // bytes in f
}

// openCappedLog creates the log at path (never through a symbolic link:
// RunDir may belong to QEMU's unprivileged user, Config.User), or with keep opens it to go on
// writing after what it holds (an adopted VM's log).
func openCappedLog(path string, max int64, keep bool) (*cappedLog, error) {
	half := max / 2
	if half < 1 {
		half = 1
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC | syscall.O_NOFOLLOW
	if keep {
		flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND | syscall.O_NOFOLLOW
	}
	f, err := os.OpenFile(path, flags, 0o640)
	if err != nil {
		return nil, err
	}
	l := &cappedLog{path: path, half: half, f: f}
	if st, err := f.Stat(); err == nil {
		l.n = st.Size()
	}
	return l, nil
}

// Write writes all of p, rotating as often as needed; of a write longer
// than the cap only the tail survives.
func (l *cappedLog) Write(p []byte) (int, error) {
	total := len(p)
	if max := 2 * l.half; int64(len(p)) > max {
		p = p[int64(len(p))-max:]
	}
	for len(p) > 0 {
		if l.n >= l.half {
			if err := l.rotate(); err != nil {
				return total - len(p), err
			}
		}
		chunk := p
		if room := l.half - l.n; int64(len(chunk)) > room {
			chunk = chunk[:room]
		}
		w, err := l.f.Write(chunk)
		l.n += int64(w)
		p = p[w:]
		if err != nil {
			return total - len(p), err
		}
	}
	return total, nil
}

func (l *cappedLog) rotate() error {
	if err := os.Rename(l.path, l.path+".1"); err != nil {
		return err
	}
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o640)
	if err != nil {
		return err
	}
	l.f.Close()
	l.f, l.n = f, 0
	return nil
}

func (l *cappedLog) Close() error { return l.f.Close() }

// removeLog removes the log at path and its rotated file.
func removeLog(path string) error {
	return errors.Join(ignoreNotExist(os.Remove(path)), ignoreNotExist(os.Remove(path+".1")))
}

func ignoreNotExist(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// logTail returns up to n bytes from the end of the log at path (reading
// into the rotated file if the current one is shorter).
func logTail(path string, n int64) string {
	cur := fileTail(path, n)
	if int64(len(cur)) < n {
		cur = fileTail(path+".1", n-int64(len(cur))) + cur
	}
	return cur
}

func fileTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := st.Size() - n
	if off < 0 {
		off = 0
	}
	b, _ := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	return string(b)
}
