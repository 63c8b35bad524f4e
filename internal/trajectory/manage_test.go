package trajectory

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/api"
)

func headIDs(hs []Head) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.ID)
	}
	return out
}

func TestList(t *testing.T) {
	js, _ := newJS(t)
	s := openStore(t, js, Options{})
	ctx := ctxT(t)
	for _, id := range []string{"a/3", "a/1", "a/5", "a/2", "a/4"} {
		begin(t, s, id, "alice")
	}
	begin(t, s, "b/1", "bob")
	var got []string
	var pages int
	for after := ""; ; {
		page, next, err := s.List(ctx, "alice", after, 2)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		got = append(got, headIDs(page)...)
		for _, h := range page {
			if h.Owner != "alice" {
				t.Fatalf("alice's list holds %s of %s", h.ID, h.Owner)
			}
		}
		if next == "" {
			break
		}
		after = next
	}
	if want := []string{"a/1", "a/2", "a/3", "a/4", "a/5"}; !slices.Equal(got, want) || pages != 3 {
		t.Fatalf("alice's pages = %v in %d pages, want %v in 3", got, pages, want)
	}
	if page, _, err := s.List(ctx, "bob", "", 10); err != nil || !slices.Equal(headIDs(page), []string{"b/1"}) {
		t.Fatalf("bob's list = %v, %v", headIDs(page), err)
	}
	if page, _, err := s.List(ctx, "carol", "", 10); err != nil || len(page) != 0 {
		t.Fatalf("carol's list = %v, %v", headIDs(page), err)
	}
	if page, next, err := s.List(ctx, "", "a/4", 10); err != nil || !slices.Equal(headIDs(page), []string{"a/5", "b/1"}) || next != "" {
		t.Fatalf("everyone's list after a/4 = %v next %q, %v", headIDs(page), next, err)
	}
}

// TestDelete: a trajectory's steps, blobs, index entry and head go;
// another's stay; the ID can be begun again, empty.
func TestDelete(t *testing.T) {
	js, _ := newJS(t)
	s := openStore(t, js, Options{})
	ctx := ctxT(t)
	big := strings.Repeat("x", 2*DefaultInlineMax)
	for _, id := range []string{"gone", "kept"} {
		begin(t, s, id, "o")
		appendN(t, s, id, 1, 5)
		e, err := s.Outputs(ctx, id, api.ExecResult{Stdout: big + id}, 0)
		if err != nil || e.StdoutBlob == "" {
			t.Fatalf("Outputs: %+v, %v", e, err)
		}
		d, _, err := s.PutBlob(ctx, id, strings.NewReader("file content of "+id))
		if err != nil {
			t.Fatal(err)
		}
		steps := []*api.TrajectoryStep{
			{Step: 6, Kind: api.KindExec, Exec: &e},
			{Step: 7, Kind: api.KindWrite, File: &api.StepFile{Path: "/workspace/f", Digest: d}},
		}
		for _, st := range steps {
			if err := s.Append(ctx, id, st); err != nil {
				t.Fatal(err)
			}
		}
	}
	blobsOf := func(id string) []string {
		var out []string
		info, err := s.blobStream.Info(ctx, jetstream.WithSubjectFilter(blobSubjectPrefix+key(id)+".*.m"))
		if err != nil {
			t.Fatal(err)
		}
		for subj := range info.State.Subjects {
			out = append(out, subj)
		}
		return out
	}
	if len(blobsOf("gone")) != 2 || len(blobsOf("kept")) != 2 {
		t.Fatalf("before the delete: blobs %v and %v, want 2 each", blobsOf("gone"), blobsOf("kept"))
	}
	if err := s.Delete(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Head(ctx, "gone"); err == nil {
		t.Error("the head is still there")
	}
	if n := subjectMsgs(t, s, "gone"); n != 0 {
		t.Errorf("%d steps are still there", n)
	}
	if b := blobsOf("gone"); len(b) != 0 {
		t.Errorf("blobs %v are still there", b)
	}
	if page, _, _ := s.List(ctx, "o", "", 10); !slices.Equal(headIDs(page), []string{"kept"}) {
		t.Errorf("list after the delete = %v", headIDs(page))
	}
	if err := s.Delete(ctx, "gone"); err == nil {
		t.Error("deleting it again succeeded")
	}
	// The other is whole.
	steps, err := s.Steps(ctx, "kept", 0, 100)
	if err != nil || !slices.Equal(stepNumbers(steps), seq(1, 7)) {
		t.Fatalf("kept's steps = %v, %v", stepNumbers(steps), err)
	}
	if got := readBlob(t, s, "kept", steps[5].Exec.StdoutBlob); string(got) != big+"kept" {
		t.Fatal("kept's blob changed")
	}
	// Begun again: an empty log that takes step 1.
	begin(t, s, "gone", "o")
	if _, ok, err := s.Last(ctx, "gone"); ok || err != nil {
		t.Fatalf("a new trajectory of a deleted one's name has a step (%v)", err)
	}
	appendN(t, s, "gone", 1, 1)
	var buf bytes.Buffer
	if err := s.Export(ctx, "gone", &buf); err != nil || strings.Count(buf.String(), "\n") != 1 {
		t.Fatalf("export = %q, %v", buf.String(), err)
	}
}

// TestOpenTwice: opening again (another server, a restart) keeps the
// state and works alongside.
func TestOpenTwice(t *testing.T) {
	js, _ := newJS(t)
	a := openStore(t, js, Options{})
	begin(t, a, "x", "o")
	appendN(t, a, "x", 1, 2)
	b := openStore(t, js, Options{})
	appendN(t, b, "x", 3, 4)
	if steps, err := a.Steps(ctxT(t), "x", 0, 10); err != nil || !slices.Equal(stepNumbers(steps), seq(1, 4)) {
		t.Fatalf("steps = %v, %v", stepNumbers(steps), err)
	}
	info, err := a.stream.Info(ctxT(t))
	if err != nil || info.Config.MaxAge != DefaultRetention || info.Config.Storage != jetstream.FileStorage {
		t.Fatalf("stream config %+v, %v", info.Config, err)
	}
}
