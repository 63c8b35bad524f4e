package builtin

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/dsec-dev/dsec/internal/sys"
)

// Sweep removes what builds interrupted by a crash (a kill -9 of the
// node mid-build) left in cacheDir: the temporary directories of builds
// that no process runs any more (the build's lock file is free),
// detaching anything still mounted in them first (see removeTemp). Builds
// in progress, in this or another process sharing cacheDir, are left
// alone. Call it at start, before Ensure; it logs what it removes.
func Sweep(cacheDir string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cacheDir, err := filepath.Abs(cacheDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range []string{Busybox, Debian12, Guest, WasmTools} {
		parent := filepath.Join(cacheDir, filepath.FromSlash(name))
		ents, err := os.ReadDir(parent)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range ents {
			version, ok := tempVersion(e.Name())
			if !ok {
				continue
			}
			removed, err := sweepTemp(filepath.Join(parent, e.Name()), filepath.Join(parent, version+".lock"))
			if err != nil {
				errs = append(errs, err)
			}
			if removed {
				log.Info("removed an interrupted build of a built-in layer", "layer", name, "dir", filepath.Join(parent, e.Name()))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("sweeping interrupted built-in layer builds: %w", errors.Join(errs...))
	}
	return nil
}

// tempVersion returns the version directory whose build made the
// temporary directory name (".<version>.tmp-<random>", see build).
func tempVersion(name string) (string, bool) {
	i := strings.LastIndex(name, ".tmp-")
	if !strings.HasPrefix(name, ".") || i < 2 {
		return "", false
	}
	return name[1:i], true
}

// sweepTemp removes the temporary directory tmp unless the build lock
// lock is held (a build runs), and reports whether it did.
func sweepTemp(tmp, lock string) (bool, error) {
	f, err := os.OpenFile(lock, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return false, err
	}
	defer f.Close() // releases the lock
	if err := sys.TryLock(f); errors.Is(err, sys.ErrLocked) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	if err := removeTemp(tmp); err != nil {
		return false, err
	}
	return true, nil
}
