package builtin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Roles of built-in layers.
const (
	RoleBase    = "base"
	RoleToolkit = "toolkit"
)

// Names of the built-in layers.
const (
	Busybox   = "base/busybox"
	Debian12  = "base/debian-12"
	Guest     = "toolkit/dsec-guest"
	WasmTools = "toolkit/wasm-tools"
)

// GuestPath is where the toolkit/dsec-guest layer holds the agent.
const GuestPath = "/opt/dsec/bin/dsec-guest"

// A Spec is a built-in layer: how to fill its directory tree.
type Spec struct {
	Name    string   // "base/busybox", "base/debian-12", "toolkit/dsec-guest", "toolkit/wasm-tools"
	Version string   // see Specs
	Role    string   // RoleBase or RoleToolkit
	Tiers   []string // the tiers it is meant for (api.Tier…)
	// Slow marks a layer whose Fill takes a while (debian-12: tens of
	// seconds to minutes, downloading from a Debian mirror); the daemon
	// builds it in the background.
	Slow bool
	// Dated marks a layer versioned by the day it was built (debian-12):
	// Ensure reuses the newest valid build in the cache, whatever its date,
	// rather than building again each day.
	Dated bool
	// Fill writes the tree into dir, an empty directory. Run as root: it
	// sets owners.
	Fill func(ctx context.Context, dir string) error

	recipe int   // revision of Fill: a cached build of another revision is rebuilt
	err    error // why this layer cannot be built on this host (Ensure returns it)
}

var containerTiers = []string{api.TierContainer, api.TierMicroVM, api.TierVM}

// Specs returns the built-in layers of a dsec binary of version
// buildVersion, in build order (Slow ones last). Versions are:
//
//   - base/busybox: the Debian version of the host's busybox-static
//     package (dpkg-query -W busybox-static);
//   - base/debian-12: the day it is built, "2006.01.02" (UTC); the
//     archive changes, so builds of different days differ;
//   - toolkit/dsec-guest: buildVersion, "-", and the first 12 hex digits
//     of the binary's SHA-256;
//   - toolkit/wasm-tools: the first 12 hex digits of the SHA-256 of its
//     file list (name and SHA-256 of every tool).
//
// A binary built without its assets (plain `go build`, as in tests)
// compiles dsec-guest and the wasm tools from the source tree, once per
// process, on the first call. A layer that cannot be built on this host
// (busybox-static missing, no source tree) still appears; Ensure returns
// the reason.
func Specs(buildVersion string) []Spec {
	return []Spec{busyboxSpec(), guestSpec(buildVersion), wasmToolsSpec(), debianSpec(today())}
}

func today() string { return time.Now().UTC().Format("2006.01.02") }

// stampFile records, beside the layer files in a cached artifact
// directory, which spec built it.
const stampFile = "builtin.json"

// Ensure returns the layer artifact for spec, building it once: artifacts
// are cached under cacheDir/<name>/<version>/ (version with characters
// other than letters, digits and "._+-" replaced by "_"), reused on later
// calls and starts, and rebuilt if missing or invalid (a manifest, file
// size or digest that does not check out, or a build by another revision
// of the recipe). Processes sharing cacheDir build a layer once: the
// build holds a lock file beside the directory. The tree is filled and
// turned into a layer in a temporary directory under cacheDir, then
// renamed into place.
//
// A Dated spec whose version is not cached is served by its newest valid
// cached build, if any; Resolve says which version that is.
func Ensure(ctx context.Context, cacheDir string, spec Spec, log *slog.Logger) (layer.Artifact, error) {
	spec = Resolve(cacheDir, spec)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	art, _, err := ensureAt(ctx, filepath.Join(cacheDir, filepath.FromSlash(spec.Name), dirName(spec.Version)), spec, log)
	return art, err
}

// Resolve returns spec with the version Ensure would use: for a Dated
// spec whose version is not in cacheDir, that of the newest valid cached
// build, if there is one; otherwise spec unchanged.
func Resolve(cacheDir string, spec Spec) Spec {
	if !spec.Dated || spec.err != nil {
		return spec
	}
	parent := filepath.Join(cacheDir, filepath.FromSlash(spec.Name))
	if _, err := load(filepath.Join(parent, dirName(spec.Version)), spec); err == nil {
		return spec
	}
	entries, _ := os.ReadDir(parent) // none cached: build
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(names)))
	for _, n := range names {
		if st, err := load(filepath.Join(parent, n), Spec{Name: spec.Name, recipe: spec.recipe}); err == nil {
			spec.Version = st.Version
			return spec
		}
	}
	return spec
}

// stamp is the content of stampFile.
type stamp struct {
	Name    string    `json:"name"`
	Version string    `json:"version"`
	Recipe  int       `json:"recipe"`
	LayerID string    `json:"layer_id"`
	Built   time.Time `json:"built"`
	// FillSeconds and LayerSeconds time the two steps of the build.
	FillSeconds  float64 `json:"fill_seconds"`
	LayerSeconds float64 `json:"layer_seconds"`
	fresh        bool    // built by this call
}

// ensureAt returns the artifact in dir, building it there if needed.
func ensureAt(ctx context.Context, dir string, spec Spec, log *slog.Logger) (layer.Artifact, stamp, error) {
	if spec.err != nil {
		return layer.Artifact{}, stamp{}, fmt.Errorf("built-in layer %s: %w", spec.Name, spec.err)
	}
	if spec.Version == "" || spec.Fill == nil {
		return layer.Artifact{}, stamp{}, fmt.Errorf("built-in layer %q: no version or Fill", spec.Name)
	}
	if st, err := load(dir, spec); err == nil {
		return artifactAt(dir, st)
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return layer.Artifact{}, stamp{}, err
	}
	unlock, err := sys.LockFile(ctx, dir+".lock")
	if err != nil {
		return layer.Artifact{}, stamp{}, err
	}
	defer unlock()
	st, err := load(dir, spec) // another process may have built it meanwhile
	if err == nil {
		return artifactAt(dir, st)
	}
	if !errors.Is(err, os.ErrNotExist) {
		log.Warn("rebuilding a cached built-in layer", "layer", spec.Name, "version", spec.Version, "dir", dir, "err", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return layer.Artifact{}, stamp{}, err
	}
	log.Info("building a built-in layer", "layer", spec.Name, "version", spec.Version, "slow", spec.Slow)
	st, err = build(ctx, dir, spec)
	if err != nil {
		return layer.Artifact{}, stamp{}, fmt.Errorf("building built-in layer %s %s: %w", spec.Name, spec.Version, err)
	}
	art, st, err := artifactAt(dir, st)
	if err == nil {
		log.Info("built a built-in layer", "layer", spec.Name, "version", spec.Version, "id", st.LayerID,
			"bytes", art.Manifest.Meta.Size+art.Manifest.Blob.Size,
			"fill", time.Duration(st.FillSeconds*float64(time.Second)).Round(time.Millisecond),
			"layer_build", time.Duration(st.LayerSeconds*float64(time.Second)).Round(time.Millisecond))
	}
	return art, st, err
}

// build fills spec's tree and builds its layer into dir, which must not
// exist.
func build(ctx context.Context, dir string, spec Spec) (stamp, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return stamp{}, err
	}
	defer removeTemp(tmp) // best effort: Sweep retries at the next start
	src, out := filepath.Join(tmp, "tree"), filepath.Join(tmp, "layer")
	if err := os.Mkdir(src, 0o755); err != nil {
		return stamp{}, err
	}
	start := time.Now()
	if err := spec.Fill(ctx, src); err != nil {
		return stamp{}, err
	}
	filled := time.Now()
	art, err := layer.BuildDir(ctx, src, out, layer.BuildOptions{})
	if err != nil {
		return stamp{}, err
	}
	st := stamp{
		Name: spec.Name, Version: spec.Version, Recipe: spec.recipe, LayerID: art.ID(), Built: start.UTC(),
		FillSeconds: filled.Sub(start).Seconds(), LayerSeconds: time.Since(filled).Seconds(), fresh: true,
	}
	if err := writeJSON(filepath.Join(out, stampFile), st); err != nil {
		return stamp{}, err
	}
	if err := os.Rename(out, dir); err != nil {
		return stamp{}, err
	}
	return st, nil
}

// removeTemp removes a build's temporary directory, first detaching,
// deepest first, anything mounted in it: Fill runs its commands contained
// (run), so nothing should be, but a build by an older dsec killed
// mid-way left debootstrap's /proc and /sys mounted there. While anything
// stays mounted below tmp it is not removed: the removal would walk into
// the host's /proc and /sys.
func removeTemp(tmp string) error {
	mounts, err := sys.MountsUnder(tmp)
	if err != nil {
		return err
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := sys.DetachMount(mounts[i]); err != nil {
			return err
		}
	}
	if mounts, err := sys.MountsUnder(tmp); err != nil || len(mounts) > 0 {
		return fmt.Errorf("not removing %s: %q still mounted there (%v)", tmp, mounts, err)
	}
	return os.RemoveAll(tmp)
}

// artifactAt reads the artifact in dir, built as st says.
func artifactAt(dir string, st stamp) (layer.Artifact, stamp, error) {
	a, err := layer.Load(dir)
	return a, st, err
}

// dirName makes a version usable as a directory name.
func dirName(version string) string {
	b := []byte(version)
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._+-", c) >= 0) {
			b[i] = '_'
		}
	}
	if s := string(b); s != "" && strings.Trim(s, ".") != "" {
		return s
	}
	return "_" + string(b)
}
