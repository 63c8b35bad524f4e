package noderpc

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// Nodes report to the control plane the sandboxes that ended by
// themselves (sandbox.Ended: an agent that died, a VM that panicked or
// powered off), which the node has already released. It is the one
// message that goes from a node to the control plane: a request on
// SubjectEnded, answered by one control plane of those running (a queue
// group), which fails the sandbox's record. A report no control plane
// answers is not lost for good: the control plane's reconciliation fails
// every running record its node no longer runs, with a vaguer reason.

// SubjectEnded is the subject of EndedReports.
const SubjectEnded = "dsec.ended"

// endedQueue is the control planes' queue group on SubjectEnded.
const endedQueue = "dsec-controlplane"

// EndedReport says that sandbox ID on Node ended by itself, and why
// (sandbox.Ended.Reason: "agent_exited: killed by SIGKILL …").
type EndedReport struct {
	Node   string    `json:"node"`
	ID     string    `json:"id"`
	Tier   string    `json:"tier"`
	Reason string    `json:"reason"`
	Time   time.Time `json:"time"`
}

// ReportEnded sends r and waits for a control plane's answer, until ctx
// ends. A failed attempt (no control plane, or one that could not write
// the record) is retried with a growing pause.
func ReportEnded(ctx context.Context, nc *nats.Conn, r EndedReport) error {
	body, err := json.Marshal(r)
	if err != nil {
		return err
	}
	pause := 100 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		reply, err := nc.RequestWithContext(actx, SubjectEnded, body)
		cancel()
		if err == nil {
			err = DecodeError(reply)
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("reporting the end of sandbox %s: %w (last: %w)", r.ID, ctx.Err(), err)
		case <-time.After(pause):
		}
		pause = min(2*pause, 5*time.Second)
	}
}

// ServeEnded answers EndedReports with handle, in the control planes'
// queue group; the function returned stops it.
func (c *Client) ServeEnded(handle func(EndedReport) error) (func(), error) {
	sub, err := c.nc.QueueSubscribe(SubjectEnded, endedQueue, func(m *nats.Msg) {
		var r EndedReport
		err := json.Unmarshal(m.Data, &r)
		if err == nil {
			err = handle(r)
		}
		reply := nats.NewMsg(m.Reply)
		if err != nil {
			EncodeError(reply, err)
		}
		_ = m.RespondMsg(reply)
	})
	if err != nil {
		return nil, fmt.Errorf("subscribing to %s: %w", SubjectEnded, err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}
