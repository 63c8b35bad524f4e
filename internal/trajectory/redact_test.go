package trajectory

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/api"
)

func bytesReader(s string) *bytes.Reader { return bytes.NewReader([]byte(s)) }

func TestRedact(t *testing.T) {
	req := api.CreateSandboxRequest{Tier: "container", Env: map[string]string{"API_KEY": "k", "TOKEN": "t", "PLAIN": "p"},
		SecretEnv: []string{"TOKEN", "API_KEY", "TOKEN", "ABSENT"}}
	got, names := Redact(req)
	if !slices.Equal(names, []string{"ABSENT", "API_KEY", "TOKEN"}) {
		t.Errorf("secret names = %v", names)
	}
	if len(got.Env) != 1 || got.Env["PLAIN"] != "p" {
		t.Errorf("redacted env = %v", got.Env)
	}
	if len(req.Env) != 3 || req.SecretEnv[0] != "TOKEN" {
		t.Errorf("the caller's request changed: %+v", req)
	}
	if r, n := Redact(api.CreateSandboxRequest{Env: map[string]string{"A": "1"}}); r.Env["A"] != "1" || n != nil {
		t.Errorf("without secrets: %+v, %v", r, n)
	}
	e, d := RedactExec(api.ExecRequest{Cmd: []string{"cat"}, Stdin: "input"})
	if e.Stdin != "" || d != Digest([]byte("input")) || e.Cmd[0] != "cat" {
		t.Errorf("RedactExec = %+v, %s", e, d)
	}
	if _, d := RedactExec(api.ExecRequest{Cmd: []string{"ls"}}); d != "" {
		t.Errorf("no stdin, digest %q", d)
	}
}

// TestRedactedNeverStored: a secret env value and a secret stdin, logged
// the way the control plane logs them, appear nowhere in what JetStream
// stores: the raw messages of the stream, the heads and the blobs. A
// plain value logged alongside is found (the search works).
func TestRedactedNeverStored(t *testing.T) {
	js, _ := newJS(t)
	s := openStore(t, js, Options{})
	ctx := ctxT(t)
	const secret, secretStdin, plain = "s3cr3t-VALUE-91f2", "stdin-s3cr3t-77aa", "plain-VALUE-0c3d"
	begin(t, s, "redact", "o")
	req, names := Redact(api.CreateSandboxRequest{Tier: "container", Image: "debian-12",
		Env: map[string]string{"API_KEY": secret, "PLAIN": plain}, SecretEnv: []string{"API_KEY"}})
	if err := s.Append(ctx, "redact", &api.TrajectoryStep{Step: 1, Kind: api.KindCreate,
		Create: &api.StepCreate{Request: req, SecretEnv: names}}); err != nil {
		t.Fatal(err)
	}
	ereq, stdin := RedactExec(api.ExecRequest{Command: "cat > key", Stdin: secretStdin})
	e, err := s.Outputs(ctx, "redact", api.ExecResult{Stdout: strings.Repeat("o", 2*DefaultInlineMax)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	e.Request, e.StdinDigest = ereq, stdin
	if err := s.Append(ctx, "redact", &api.TrajectoryStep{Step: 2, Kind: api.KindExec, Exec: &e}); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx, "redact"); err != nil {
		t.Fatal(err)
	}
	var raw bytes.Buffer
	for _, name := range []string{StreamName, "KV_" + BucketHeads, StreamBlobs} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for q := info.State.FirstSeq; q <= info.State.LastSeq && q > 0; q++ {
			m, err := st.GetMsg(ctx, q)
			if err == jetstream.ErrMsgNotFound {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			raw.WriteString(m.Subject)
			for k, v := range m.Header {
				raw.WriteString(k + strings.Join(v, ""))
			}
			raw.Write(m.Data)
		}
	}
	if !bytes.Contains(raw.Bytes(), []byte(plain)) {
		t.Fatal("negative control: the plain env value is not in the stored bytes; the search is broken")
	}
	for _, v := range []string{secret, secretStdin} {
		if bytes.Contains(raw.Bytes(), []byte(v)) {
			t.Errorf("secret %q is stored", v)
		}
	}
}
