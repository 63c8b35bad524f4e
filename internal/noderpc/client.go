package noderpc

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// HdrReq carries a request's JSON when the body holds raw data.
const HdrReq = "Dsec-Req"

// DefaultTimeout bounds calls whose context has no deadline.
const DefaultTimeout = 30 * time.Second

// Client calls node services. It is safe for concurrent use.
type Client struct {
	nc    *nats.Conn
	mux   *respMux
	calls atomic.Uint64
	// prefix makes call IDs unique across control-plane processes.
	prefix string
}

// NewClient returns a client on nc.
func NewClient(nc *nats.Conn) *Client {
	return &Client{nc: nc, mux: newRespMux(nc), prefix: nats.NewInbox()[len("_INBOX."):]}
}

func (c *Client) request(ctx context.Context, node, op string, req any, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encoding %s request: %w", op, err)
	}
	msg, err := c.roundTrip(ctx, node, &nats.Msg{Subject: Subject(node, op), Data: body})
	if err != nil {
		return err
	}
	if resp == nil {
		return nil
	}
	if err := json.Unmarshal(msg.Data, resp); err != nil {
		return fmt.Errorf("decoding %s reply from node %s: %w", op, node, err)
	}
	return nil
}

func (c *Client) roundTrip(ctx context.Context, node string, m *nats.Msg) (*nats.Msg, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	reply, err := c.nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, mapNATSError(node, err)
	}
	if err := DecodeError(reply); err != nil {
		return nil, err
	}
	return reply, nil
}

// Create creates a sandbox on node.
func (c *Client) Create(ctx context.Context, node string, req CreateRequest) error {
	return c.request(ctx, node, OpCreate, req, nil)
}

// Destroy destroys a sandbox on node; destroying an unknown one succeeds.
func (c *Client) Destroy(ctx context.Context, node, id string) error {
	return c.request(ctx, node, OpDestroy, Target{ID: id}, nil)
}

// List lists the sandboxes node runs.
func (c *Client) List(ctx context.Context, node string) ([]SandboxStatus, error) {
	var resp ListResponse
	err := c.request(ctx, node, OpList, struct{}{}, &resp)
	return resp.Sandboxes, err
}

// Output receives streamed exec output. Either may be nil.
type Output struct {
	Stdout, Stderr func([]byte)
}

// Exec runs a command in sandbox id on node and returns its result. If out
// is given, output is streamed to it as produced and the result's Stdout
// and Stderr are empty. Cancelling ctx cancels the command on the node.
func (c *Client) Exec(ctx context.Context, node, id string, req api.ExecRequest, out *Output) (api.ExecResult, error) {
	res, _, err := c.exec(ctx, node, ExecRequest{ID: id, Req: req, Stream: out != nil, Step: StepOf(ctx)}, out)
	return res, err
}

// ExecStep is Exec of trajectory step step (its audit events are tagged
// with it) that also says whether the command was pure. It costs the
// node a look at the sandbox's writable state before and after.
func (c *Client) ExecStep(ctx context.Context, node, id string, step int, req api.ExecRequest, out *Output) (api.ExecResult, StepInfo, error) {
	return c.exec(ctx, node, ExecRequest{ID: id, Req: req, Stream: out != nil, Step: step, Track: true}, out)
}

func (c *Client) exec(ctx context.Context, node string, ereq ExecRequest, out *Output) (api.ExecResult, StepInfo, error) {
	req := ereq.Req
	if _, ok := ctx.Deadline(); !ok {
		// A node that dies mid-call never answers; bound the wait.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutS*float64(time.Second))+DefaultTimeout)
		defer cancel()
	}
	n := strconv.FormatUint(c.calls.Add(1), 36)
	call := c.prefix + "." + n
	ereq.Call = call
	body, err := json.Marshal(ereq)
	if err != nil {
		return api.ExecResult{}, StepInfo{}, fmt.Errorf("encoding exec request: %w", err)
	}
	inbox, q, err := c.mux.open(n)
	if err != nil {
		return api.ExecResult{}, StepInfo{}, mapNATSError(node, err)
	}
	defer c.mux.close(n)
	if err := c.nc.PublishMsg(&nats.Msg{Subject: Subject(node, OpExec), Reply: inbox, Data: body}); err != nil {
		return api.ExecResult{}, StepInfo{}, mapNATSError(node, err)
	}
	var (
		stdout, stderr []byte
		seq            int
	)
	for {
		msg, err := q.next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				c.cancel(node, call)
				return api.ExecResult{}, StepInfo{}, ctx.Err()
			}
			return api.ExecResult{}, StepInfo{}, mapNATSError(node, err)
		}
		if err := DecodeError(msg); err != nil {
			return api.ExecResult{}, StepInfo{}, err
		}
		seq++
		if got := msg.Header.Get(HdrSeq); got != strconv.Itoa(seq) {
			c.cancel(node, call)
			return api.ExecResult{}, StepInfo{}, errdefs.New(errdefs.Unavailable, api.CodeStreamBroken, "output from node %s arrived out of order (message %q, expected %d)", node, got, seq)
		}
		switch msg.Header.Get(HdrKind) {
		case api.EventStdout:
			if out != nil && out.Stdout != nil {
				out.Stdout(msg.Data)
			} else if out == nil {
				stdout = append(stdout, msg.Data...)
			}
		case api.EventStderr:
			if out != nil && out.Stderr != nil {
				out.Stderr(msg.Data)
			} else if out == nil {
				stderr = append(stderr, msg.Data...)
			}
		case api.EventExit:
			var exit ExitMessage
			if err := json.Unmarshal(msg.Data, &exit); err != nil {
				return exit.ExecResult, StepInfo{}, fmt.Errorf("decoding exec result from node %s: %w", node, err)
			}
			res := exit.ExecResult
			var info StepInfo
			if exit.StepInfo != nil {
				info = *exit.StepInfo
			}
			if len(stdout) > 0 {
				res.Stdout = string(stdout) + res.Stdout
			}
			if len(stderr) > 0 {
				res.Stderr = string(stderr) + res.Stderr
			}
			return res, info, nil
		default:
			return api.ExecResult{}, StepInfo{}, errdefs.New(errdefs.Internal, api.CodeBadReply, "unexpected message kind %q from node %s", msg.Header.Get(HdrKind), node)
		}
	}
}

// cancel tells the node to stop a call; best effort, since the caller has
// already given up on it.
func (c *Client) cancel(node, call string) {
	b, _ := json.Marshal(CancelRequest{Call: call})
	_ = c.nc.Publish(Subject(node, OpCancel), b)
}
