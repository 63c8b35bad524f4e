package noderpc

import (
	"context"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// respMux receives every multi-message reply (exec output) on one
// wildcard subscription and hands each message to its call's queue.
// Subscribing per call costs a subscription round trip and a channel per
// call; this costs a map entry.
type respMux struct {
	nc     *nats.Conn
	prefix string // "_INBOX.<random>."

	mu    sync.Mutex // guards following fields
	sub   *nats.Subscription
	calls map[string]*callQueue
}

func newRespMux(nc *nats.Conn) *respMux {
	return &respMux{nc: nc, prefix: nats.NewInbox() + ".", calls: map[string]*callQueue{}}
}

// open registers a call and returns its reply subject and queue. close
// must be called when the call ends.
func (m *respMux) open(token string) (string, *callQueue, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sub == nil {
		sub, err := m.nc.Subscribe(m.prefix+"*", m.deliver)
		if err != nil {
			return "", nil, err
		}
		// Output bursts must not make the subscription a slow consumer;
		// memory is bounded by the output caps of the calls in flight.
		_ = sub.SetPendingLimits(-1, -1)
		m.sub = sub
	}
	q := &callQueue{signal: make(chan struct{}, 1)}
	m.calls[token] = q
	return m.prefix + token, q, nil
}

func (m *respMux) close(token string) {
	m.mu.Lock()
	delete(m.calls, token)
	m.mu.Unlock()
}

func (m *respMux) deliver(msg *nats.Msg) {
	token := strings.TrimPrefix(msg.Subject, m.prefix)
	m.mu.Lock()
	q := m.calls[token]
	m.mu.Unlock()
	if q != nil {
		q.push(msg)
	}
}

// callQueue is an unbounded FIFO of one call's messages; the dispatcher
// never blocks on a slow reader.
type callQueue struct {
	mu     sync.Mutex // guards msgs
	msgs   []*nats.Msg
	signal chan struct{}
}

func (q *callQueue) push(m *nats.Msg) {
	q.mu.Lock()
	q.msgs = append(q.msgs, m)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *callQueue) next(ctx context.Context) (*nats.Msg, error) {
	for {
		q.mu.Lock()
		if len(q.msgs) > 0 {
			m := q.msgs[0]
			q.msgs[0] = nil
			q.msgs = q.msgs[1:]
			q.mu.Unlock()
			return m, nil
		}
		q.mu.Unlock()
		select {
		case <-q.signal:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
