package function

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestHammer runs mixed calls from many goroutines on shared sandboxes
// while other sandboxes are created, used and destroyed, to shake out
// races in the pool, the memory allocator and the sandbox gate.
func TestHammer(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{PoolSize: 2})
	shared := []*Sandbox{create(t, rt, nil), create(t, rt, nil)}
	const workers, iterations = 6, 20
	var wg sync.WaitGroup
	errs := make(chan error, workers*iterations+100)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < iterations; i++ {
				sb := shared[(w+i)%len(shared)]
				msg := fmt.Sprintf("w%d-i%d", w, i)
				var req api.ExecRequest
				var check func(api.ExecResult) bool
				switch i % 5 {
				case 0:
					req = api.ExecRequest{Cmd: []string{"echo", msg}}
					check = func(r api.ExecResult) bool { return r.Stdout == msg+"\n" }
				case 1:
					req = api.ExecRequest{Cmd: []string{"cat"}, Stdin: msg}
					check = func(r api.ExecResult) bool { return r.Stdout == msg }
				case 2:
					req = api.ExecRequest{Cmd: []string{"trap"}}
					check = func(r api.ExecResult) bool { return r.ExitCode == -1 && strings.HasPrefix(r.Error, "wasm trap") }
				case 3:
					req = api.ExecRequest{Cmd: []string{"sleep", "10"}, TimeoutS: 0.05}
					check = func(r api.ExecResult) bool { return r.TimedOut }
				case 4:
					req = api.ExecRequest{Cmd: []string{"tiny-echo"}, Stdin: msg}
					check = func(r api.ExecResult) bool { return r.Stdout == msg }
				}
				if req.TimeoutS == 0 {
					req.TimeoutS = 30
				}
				res, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: req})
				if err != nil || !check(res) {
					errs <- fmt.Errorf("%q: %+v, %v", req.Cmd, res, err)
				}
			}
		}(w)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 5; i++ {
			sb, err := rt.Create(context.Background(), sandbox.Spec{ID: fmt.Sprintf("churn-%d", i), Image: testImage(t), MemoryMB: 64, DiskMB: 8})
			if err != nil {
				errs <- err
				return
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"sleep", "10"}, TimeoutS: 30}})
				if err != nil && !errors.Is(err, errdefs.NotFound) {
					errs <- fmt.Errorf("call on a destroyed sandbox: %v", err)
				}
			}()
			if res, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"echo", "x"}, TimeoutS: 30}}); err != nil || res.Stdout != "x\n" {
				errs <- fmt.Errorf("churn echo: %+v, %v", res, err)
			}
			if err := sb.Destroy(context.Background()); err != nil {
				errs <- err
			}
			<-done
		}
	}()
	testenv.WaitGroup(t, &wg, 5*time.Minute, "the hammer's goroutines")
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
