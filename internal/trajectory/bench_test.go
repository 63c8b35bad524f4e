package trajectory

import (
	"testing"

	"github.com/dsec-dev/dsec/api"
)

// BenchmarkAppend measures logging one exec-sized step, the
// acknowledgement waited for: the overhead a recorded exec pays.
func BenchmarkAppend(b *testing.B) {
	js, _ := newJS(b)
	s := openStore(b, js, Options{})
	begin(b, s, "bench", "o")
	ctx := ctxT(b)
	res := api.ExecResult{Stdout: string(make([]byte, 2048)), Stderr: "warning: something\n", DurationMS: 12}
	e, err := s.Outputs(ctx, "bench", res, 0)
	if err != nil {
		b.Fatal(err)
	}
	e.Request = api.ExecRequest{Cmd: []string{"make", "test"}, Cwd: "/workspace", TimeoutS: 60}
	b.ResetTimer()
	for i := range b.N {
		st := &api.TrajectoryStep{Step: i + 1, Kind: api.KindExec, Sandbox: "sb-bench", Exec: &e, DurationMS: 12}
		if err := s.Append(ctx, "bench", st); err != nil {
			b.Fatal(err)
		}
	}
}
