// Package image names, composes and resolves the images sandboxes start
// from. An image is an ordered list of layers (base, workspace, toolkit;
// more allowed), identified by the SHA-256 of its manifest; names
// (name:tag) point at image IDs and can move, IDs cannot. Layers are
// EROFS artifacts whose files live in the blob store and whose records
// live in the store. Development images can also be a directory on the
// server (`dsec image add-dir`).
package image

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/blobstore"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/store"
)

// DefaultTag is the tag of a name given without one.
const DefaultTag = "latest"

// Roles of the usual three layers, bottom first.
const (
	RoleBase      = "base"
	RoleWorkspace = "workspace"
	RoleToolkit   = "toolkit"
)

// cacheTTL is how long a resolved name is reused without asking the
// store. Every create resolves its image; under a burst of creates the
// store's latency would otherwise add to each one. A re-tag is seen by
// other servers within this time. Records by ID are immutable and cached
// for good.
const cacheTTL = 5 * time.Second

// records is the part of the store the registry uses.
type records interface {
	PutImage(ctx context.Context, r store.ImageRecord) error
	GetImage(ctx context.Context, id string) (store.ImageRecord, error)
	DeleteImage(ctx context.Context, id string) error
	SetImageName(ctx context.Context, name, id string) error
	GetImageName(ctx context.Context, name string) (store.NameRecord, error)
	DeleteImageName(ctx context.Context, name string) error
	ListImages(ctx context.Context) ([]store.ImageRecord, []store.NameRecord, error)
	PutLayer(ctx context.Context, r store.LayerRecord) error
	GetLayer(ctx context.Context, id string) (store.LayerRecord, error)
	DeleteLayer(ctx context.Context, id string) error
	SetLayerName(ctx context.Context, name, id string) error
	GetLayerName(ctx context.Context, name string) (store.NameRecord, error)
	DeleteLayerName(ctx context.Context, name string) error
	ListLayers(ctx context.Context) ([]store.LayerRecord, []store.NameRecord, error)
}

// Options configure a Registry.
type Options struct {
	Records records
	// Blobs holds layer files. Required for layer operations.
	Blobs blobstore.Store
	// WorkDir holds layer builds in progress.
	WorkDir string
	// Build limits for uploaded archives.
	Limits layer.BuildOptions
}

// Registry resolves and manages images and layers. It is safe for
// concurrent use.
type Registry struct {
	recs    records
	blobs   blobstore.Store
	workDir string
	limits  layer.BuildOptions

	mu        sync.Mutex // guards following fields
	names     map[string]cachedName
	byID      map[string]store.ImageRecord
	layers    map[string]store.LayerRecord
	pathCache []cachedPaths // the last layers listed (LayerPaths), oldest first
	// agentIn says, by layer ID, whether the layer holds the agent.
	agentIn map[string]bool
}

type cachedName struct {
	id      string
	expires time.Time
}

// New returns a registry.
func New(opt Options) *Registry {
	return &Registry{recs: opt.Records, blobs: opt.Blobs, workDir: opt.WorkDir, limits: opt.Limits,
		names: map[string]cachedName{}, byID: map[string]store.ImageRecord{}, layers: map[string]store.LayerRecord{},
		agentIn: map[string]bool{}}
}

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._/-]{0,127}(:[A-Za-z0-9._-]{1,64})?$`)

// Normalize validates a name and adds the default tag.
func Normalize(ref string) (string, error) {
	if !namePattern.MatchString(ref) || strings.Contains(ref, "..") || strings.Contains(ref, "//") ||
		strings.HasSuffix(strings.SplitN(ref, ":", 2)[0], "/") {
		return "", errdefs.New(errdefs.Invalid, api.CodeInvalidName, "name %q is not valid (lower-case name[/path][:tag])", ref)
	}
	if !strings.Contains(ref, ":") {
		ref += ":" + DefaultTag
	}
	return ref, nil
}

// Resolved is an image ready to place: its manifest and its layers'
// records, bottom first.
type Resolved struct {
	ID       string
	Name     string // the name it was resolved by, if any
	Manifest store.ImageManifest
	Layers   []store.LayerRecord
}

// Source is "layers" or the directory source of a development image.
func (r Resolved) Source() string {
	if r.Manifest.Source != "" {
		return r.Manifest.Source
	}
	return "layers"
}

// Supports reports whether the image is meant for tier.
func (r Resolved) Supports(tier string) bool {
	return len(r.Manifest.Tiers) == 0 || slices.Contains(r.Manifest.Tiers, tier)
}

// Resolve returns the image a reference names: name[:tag] or an image ID.
func (r *Registry) Resolve(ctx context.Context, ref string) (Resolved, error) {
	id, name := ref, ""
	if !layer.ValidDigest(ref) {
		n, err := Normalize(ref)
		if err != nil {
			return Resolved{}, err
		}
		if id, err = r.imageName(ctx, n); err != nil {
			return Resolved{}, err
		}
		name = n
	}
	rec, err := r.image(ctx, id)
	if err != nil {
		return Resolved{}, err
	}
	res := Resolved{ID: rec.ID, Name: name, Manifest: rec.Manifest}
	for _, l := range rec.Manifest.Layers {
		lr, err := r.layer(ctx, l.ID)
		if err != nil {
			return Resolved{}, err
		}
		res.Layers = append(res.Layers, lr)
	}
	return res, nil
}

func (r *Registry) imageName(ctx context.Context, name string) (string, error) {
	now := time.Now()
	r.mu.Lock()
	c, ok := r.names[name]
	r.mu.Unlock()
	if ok && now.Before(c.expires) {
		return c.id, nil
	}
	n, err := r.recs.GetImageName(ctx, name)
	if err != nil {
		return "", err
	}
	r.mu.Lock()
	r.names[name] = cachedName{id: n.ID, expires: now.Add(cacheTTL)}
	r.mu.Unlock()
	return n.ID, nil
}

func (r *Registry) image(ctx context.Context, id string) (store.ImageRecord, error) {
	r.mu.Lock()
	rec, ok := r.byID[id]
	r.mu.Unlock()
	if ok {
		return rec, nil
	}
	rec, err := r.recs.GetImage(ctx, id)
	if err != nil {
		return rec, err
	}
	r.mu.Lock()
	r.byID[id] = rec
	r.mu.Unlock()
	return rec, nil
}

func (r *Registry) forgetName(name string) {
	r.mu.Lock()
	delete(r.names, name)
	r.mu.Unlock()
}

// Compose builds (and stores) the image of the given layers without
// naming it, exactly as given; inline layers on a create land here. A
// base may name an image instead of a layer: its layers, with their
// roles, are the new image's bottom ones.
func (r *Registry) Compose(ctx context.Context, layers []api.ImageLayer, tiers []string) (Resolved, error) {
	return r.compose(ctx, layers, tiers, false)
}

// compose is Compose that, with agent set, adds the agent's layer where
// the image needs it (ensureAgent).
func (r *Registry) compose(ctx context.Context, layers []api.ImageLayer, tiers []string, agent bool) (Resolved, error) {
	if len(layers) == 0 {
		return Resolved{}, errdefs.New(errdefs.Invalid, api.CodeNoLayers, "an image needs at least one layer")
	}
	if len(layers) > 16 {
		return Resolved{}, errdefs.New(errdefs.Invalid, api.CodeTooManyLayers, "an image has at most 16 layers")
	}
	for _, t := range tiers {
		if !slices.Contains(api.Tiers, t) {
			return Resolved{}, errdefs.New(errdefs.Invalid, api.CodeUnknownTier, "unknown tier %q", t)
		}
	}
	m := store.ImageManifest{Version: 1, Tiers: tiers}
	res := Resolved{}
	var resolved []api.ImageLayer
	for _, l := range layers {
		if l.Role == "" || len(l.Role) > 32 {
			return Resolved{}, errdefs.New(errdefs.Invalid, api.CodeInvalidRole, "layer %q needs a role (base, workspace, toolkit, …)", l.ID)
		}
		lr, err := r.ResolveLayer(ctx, l.ID)
		if errdefs.ClassOf(err) == errdefs.NotFound && !layer.ValidDigest(l.ID) {
			if img, ierr := r.Resolve(ctx, l.ID); ierr == nil {
				if l.Role != RoleBase {
					return Resolved{}, errdefs.New(errdefs.Invalid, api.CodeImageNotLayer,
						"%s is an image, not a layer: an image can only be the base (its layers, %s, become the new image's bottom ones); as %s, name one of its layers", l.ID, layerNames(img), l.Role)
				}
				for i, il := range img.Manifest.Layers {
					resolved = append(resolved, api.ImageLayer{Role: il.Role, ID: il.ID})
					res.Layers = append(res.Layers, img.Layers[i])
				}
				continue
			}
			return Resolved{}, errdefs.New(errdefs.NotFound, api.CodeLayerNotFound, "no layer named %s (nor an image, which a base may be)", l.ID)
		}
		if err != nil {
			return Resolved{}, err
		}
		resolved = append(resolved, api.ImageLayer{Role: l.Role, ID: lr.ID})
		res.Layers = append(res.Layers, lr)
	}
	if len(resolved) > 16 {
		return Resolved{}, errdefs.New(errdefs.Invalid, api.CodeTooManyLayers, "an image has at most 16 layers")
	}
	if agent {
		var err error
		if resolved, res.Layers, err = r.ensureAgent(ctx, resolved, res.Layers, tiers); err != nil {
			return Resolved{}, err
		}
	}
	for _, l := range resolved {
		m.Layers = append(m.Layers, store.ImageLayer{Role: l.Role, ID: l.ID})
	}
	rec := store.ImageRecord{ID: m.ID(), Manifest: m, Created: time.Now().UTC()}
	if err := r.recs.PutImage(ctx, rec); err != nil {
		return Resolved{}, err
	}
	res.ID, res.Manifest = rec.ID, m
	return res, nil
}

// Create composes an image (see Compose) and gives it a name. An image
// the container tier may run (tiers empty or naming it) whose layers lack
// the agent gets the server's agent layer on top, or is refused (Invalid,
// image_lacks_guest) if the server has none: it would be accepted here
// and fail at every create.
func (r *Registry) Create(ctx context.Context, name string, layers []api.ImageLayer, tiers []string) (Resolved, error) {
	n, err := Normalize(name)
	if err != nil {
		return Resolved{}, err
	}
	res, err := r.compose(ctx, layers, tiers, true)
	if err != nil {
		return Resolved{}, err
	}
	if err := r.recs.SetImageName(ctx, n, res.ID); err != nil {
		return Resolved{}, err
	}
	r.forgetName(n)
	res.Name = n
	return res, nil
}

// Tag points name at the image ref resolves to.
func (r *Registry) Tag(ctx context.Context, ref, name string) (Resolved, error) {
	n, err := Normalize(name)
	if err != nil {
		return Resolved{}, err
	}
	res, err := r.Resolve(ctx, ref)
	if err != nil {
		return Resolved{}, err
	}
	if err := r.recs.SetImageName(ctx, n, res.ID); err != nil {
		return Resolved{}, err
	}
	r.forgetName(n)
	res.Name = n
	return res, nil
}

// Remove deletes an image name, or, given an ID, the image and every
// name pointing at it. Whether the image is in use is the caller's check.
func (r *Registry) Remove(ctx context.Context, ref string) error {
	if layer.ValidDigest(ref) {
		_, names, err := r.recs.ListImages(ctx)
		if err != nil {
			return err
		}
		for _, n := range names {
			if n.ID == ref {
				if err := r.recs.DeleteImageName(ctx, n.Name); err != nil {
					return err
				}
				r.forgetName(n.Name)
			}
		}
		if _, err := r.recs.GetImage(ctx, ref); err != nil {
			return err
		}
		r.mu.Lock()
		delete(r.byID, ref)
		r.mu.Unlock()
		return r.recs.DeleteImage(ctx, ref)
	}
	n, err := Normalize(ref)
	if err != nil {
		return err
	}
	if _, err := r.recs.GetImageName(ctx, n); err != nil {
		return err
	}
	r.forgetName(n)
	return r.recs.DeleteImageName(ctx, n)
}

// List returns one entry per image name, and one per unnamed image,
// sorted by name.
func (r *Registry) List(ctx context.Context) ([]api.Image, error) {
	recs, names, err := r.recs.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	byID := map[string]store.ImageRecord{}
	for _, rec := range recs {
		byID[rec.ID] = rec
	}
	named := map[string]bool{}
	var out []api.Image
	for _, n := range names {
		if rec, ok := byID[n.ID]; ok {
			out = append(out, ToAPI(rec, n.Name))
			named[n.ID] = true
		}
	}
	for _, rec := range recs {
		if !named[rec.ID] {
			out = append(out, ToAPI(rec, ""))
		}
	}
	slices.SortFunc(out, func(a, b api.Image) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	if out == nil {
		out = []api.Image{}
	}
	return out, nil
}

// ToAPI converts a record to its wire form.
func ToAPI(rec store.ImageRecord, name string) api.Image {
	img := api.Image{ID: rec.ID, Name: name, Tiers: rec.Manifest.Tiers, Source: "layers", CreatedAt: rec.Created}
	if rec.Manifest.Source != "" {
		img.Source = rec.Manifest.Source
	}
	for _, l := range rec.Manifest.Layers {
		img.Layers = append(img.Layers, api.ImageLayer{Role: l.Role, ID: l.ID})
	}
	return img
}

// APIOf is ToAPI for a resolved image.
func APIOf(res Resolved) api.Image {
	return ToAPI(store.ImageRecord{ID: res.ID, Manifest: res.Manifest}, res.Name)
}

// maxStacked bounds the layers of an image that snapshots stacked on
// another: each snapshot adds one; overlayfs takes up to 500 lowers, and
// each is one more mount to hold.
const maxStacked = 128

// Stack records the image made of base (an image's ID or name) with top
// on it (layers by ID or name, bottom first): the image of a snapshot.
// Unlike Compose it takes an image's ID as the base, and its limit is
// maxStacked, not 16, since snapshots add layers one by one.
func (r *Registry) Stack(ctx context.Context, base string, top []api.ImageLayer, tiers []string) (Resolved, error) {
	img, err := r.Resolve(ctx, base)
	if err != nil {
		return Resolved{}, err
	}
	if img.Source() != "layers" {
		return Resolved{}, errdefs.New(errdefs.Unsupported, api.CodeImageSourceUnsupported, "image %s is a directory, not layers: nothing can be stacked on it", base)
	}
	m := store.ImageManifest{Version: 1, Tiers: tiers, Layers: slices.Clone(img.Manifest.Layers)}
	res := Resolved{Layers: slices.Clone(img.Layers)}
	for _, l := range top {
		lr, err := r.ResolveLayer(ctx, l.ID)
		if err != nil {
			return Resolved{}, err
		}
		m.Layers = append(m.Layers, store.ImageLayer{Role: l.Role, ID: lr.ID})
		res.Layers = append(res.Layers, lr)
	}
	if len(m.Layers) > maxStacked {
		return Resolved{}, errdefs.New(errdefs.Invalid, api.CodeTooManyLayers, "an image stacks at most %d layers", maxStacked)
	}
	rec := store.ImageRecord{ID: m.ID(), Manifest: m, Created: time.Now().UTC()}
	if err := r.recs.PutImage(ctx, rec); err != nil {
		return Resolved{}, err
	}
	res.ID, res.Manifest = rec.ID, m
	return res, nil
}
