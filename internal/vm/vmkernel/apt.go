package vmkernel

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// MetaPackage is the Debian package whose dependency names the current
// kernel package (linux-image-<release>-amd64).
const MetaPackage = "linux-image-amd64"

// debPackage is a binary package as the host's apt index describes it.
type debPackage struct {
	Name, Version, SHA256 string
}

// resolveReuse is how long a resolution is reused by resolveRecent. A
// node's start prepares both VM tiers' boot files, one after the other,
// and each resolution is two apt-cache runs: ~0.1 s with apt's binary
// cache, but 2.5 s each at a load of 8 on this host, which has none
// (apt-cache then parses the package lists every time).
const resolveReuse = time.Minute

var lastResolve struct {
	mu  sync.Mutex // guards following fields
	at  time.Time
	pkg debPackage
}

// resolveRecent is resolve, reusing a successful answer under
// resolveReuse old: an index that changes meanwhile is seen a minute
// later, which a cached kernel does not mind.
func resolveRecent(ctx context.Context) (debPackage, error) {
	lastResolve.mu.Lock()
	defer lastResolve.mu.Unlock()
	if !lastResolve.at.IsZero() && time.Since(lastResolve.at) < resolveReuse {
		return lastResolve.pkg, nil
	}
	pkg, err := resolve(ctx)
	if err == nil {
		lastResolve.at, lastResolve.pkg = time.Now(), pkg
	}
	return pkg, err
}

// resolve finds the kernel package MetaPackage's candidate depends on, and
// its digest, from the host's apt index (no network).
func resolve(ctx context.Context) (debPackage, error) {
	meta, err := aptShow(ctx, MetaPackage)
	if err != nil {
		return debPackage{}, err
	}
	name := firstDepends(meta["Depends"])
	if !strings.HasPrefix(name, "linux-image-") {
		return debPackage{}, fmt.Errorf("%s %s depends on %q, not a linux-image package", MetaPackage, meta["Version"], meta["Depends"])
	}
	p, err := aptShow(ctx, name)
	if err != nil {
		return debPackage{}, err
	}
	pkg := debPackage{Name: name, Version: p["Version"], SHA256: p["SHA256"]}
	if pkg.Version == "" || len(pkg.SHA256) != 64 {
		return debPackage{}, fmt.Errorf("apt index has no version or SHA256 for %s", name)
	}
	return pkg, nil
}

// aptShow returns the fields of the candidate version of package name.
func aptShow(ctx context.Context, name string) (map[string]string, error) {
	out, err := aptCmd(ctx, "", "apt-cache", "show", "--no-all-versions", name)
	if err != nil {
		return nil, err
	}
	fields := map[string]string{}
	s := bufio.NewScanner(bytes.NewReader(out))
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		l := s.Text()
		if l == "" {
			break // the first record only
		}
		if k, v, ok := strings.Cut(l, ": "); ok && !strings.HasPrefix(l, " ") {
			fields[k] = v
		}
	}
	if fields["Package"] != name {
		return nil, fmt.Errorf("apt-cache show %s: no such package", name)
	}
	return fields, nil
}

// firstDepends is the package name of the first dependency in a Depends
// field ("a (>= 1) | b, c" gives "a").
func firstDepends(depends string) string {
	first, _, _ := strings.Cut(depends, ",")
	first, _, _ = strings.Cut(first, "|")
	name, _, _ := strings.Cut(strings.TrimSpace(first), " ")
	return name
}

// download fetches pkg's .deb into dir with apt-get (the host's Debian
// mirror) and returns its path.
func download(ctx context.Context, dir string, pkg debPackage) (string, error) {
	if _, err := aptCmd(ctx, dir, "apt-get", "download", "-q", pkg.Name+"="+pkg.Version); err != nil {
		return "", err
	}
	debs, _ := filepath.Glob(filepath.Join(dir, pkg.Name+"_*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("apt-get download %s left %d .deb files", pkg.Name, len(debs))
	}
	return debs[0], nil
}

// aptUpdate refreshes the host's apt index (needs root).
func aptUpdate(ctx context.Context) error {
	_, err := aptCmd(ctx, "", "apt-get", "update", "-qq")
	// The index may name another package now.
	lastResolve.mu.Lock()
	lastResolve.at = time.Time{}
	lastResolve.mu.Unlock()
	return err
}

func aptCmd(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	if _, err := exec.LookPath(name); err != nil {
		return nil, fmt.Errorf("the guest kernel comes from Debian's package mirror through %s: %w", name, errdefs.ErrNotSupported)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
