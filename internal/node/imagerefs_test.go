package node

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/noderpc"
)

// TestCreateWire: a create request decodes with its image left encoded,
// the image decodes once per encoding, and a bad one is bad_request.
func TestCreateWire(t *testing.T) {
	ref := noderpc.ImageRef{ID: "img", Name: "team/tools:v1", Source: "dir:/x",
		Layers: []noderpc.LayerRef{{ID: "sha256:1", Manifest: layerspec.Manifest{MediaType: layerspec.MediaType, Version: 1}}}}
	b, err := json.Marshal(noderpc.CreateRequest{ID: "sb1", Tier: "function", Image: ref, DiskMB: 64})
	if err != nil {
		t.Fatal(err)
	}
	var w createWire
	if err := decode(b, &w); err != nil {
		t.Fatal(err)
	}
	if w.ID != "sb1" || w.Tier != "function" || w.DiskMB != 64 || len(w.Image) == 0 || w.CreateRequest.Image.ID != "" {
		t.Fatalf("decoded %+v (image %s)", w.CreateRequest, w.Image)
	}
	var c imageRefs
	got, err := c.decode(w.Image)
	if err != nil || !reflect.DeepEqual(got, ref) {
		t.Fatalf("image = %+v, %v; want %+v", got, err, ref)
	}
	again, err := c.decode(append(json.RawMessage(nil), w.Image...))
	if err != nil || !reflect.DeepEqual(again, ref) || len(c.refs) != 1 {
		t.Errorf("second decode = %+v, %v, %d cached", again, err, len(c.refs))
	}
	if _, err := c.decode(json.RawMessage(`{"id": 5}`)); errdefs.ClassOf(err) != errdefs.Invalid {
		t.Errorf("a bad image: %v, want Invalid", err)
	}
}
