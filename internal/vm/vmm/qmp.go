package vmm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// maxQMPMessage bounds one QMP message: QEMU is on the far side of the
// trust boundary from the node service's point of view once a guest has
// escaped into it, so nothing it sends may grow the agent's memory freely.
const maxQMPMessage = 4 << 20

// eventBuffer is how many undelivered events a QMP client keeps.
const eventBuffer = 64

// Event is an asynchronous QMP event (SHUTDOWN, STOP, RESUME, RESET…).
type Event struct {
	Name string          `json:"event"`
	Data json.RawMessage `json:"data,omitempty"`
	Time time.Time       `json:"-"`
}

// QMPError is an error QEMU returned for a command.
type QMPError struct {
	Command string
	Class   string `json:"class"`
	Desc    string `json:"desc"`
}

func (e *QMPError) Error() string {
	return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc)
}

// ErrQMPClosed is returned by commands on a closed QMP connection (QEMU
// exited, or Close was called).
var ErrQMPClosed = errors.New("qmp connection closed")

// QMP is a client of QEMU's machine protocol: JSON messages, one a line,
// over a unix socket. Commands carry ids, so several goroutines may run
// commands at once; events are delivered on Events. A QMP is safe for
// concurrent use.
type QMP struct {
	conn   net.Conn
	events chan Event
	done   chan struct{} // closed when the reader stops
	// Greeting is QEMU's greeting (its version and capabilities).
	Greeting json.RawMessage

	wmu sync.Mutex // serialises writes

	mu      sync.Mutex // guards following fields
	nextID  uint64
	pending map[string]chan qmpReply
	err     error // why the reader stopped
	dropped int   // events lost because nobody read Events
}

type qmpReply struct {
	Return json.RawMessage `json:"return"`
	Error  *QMPError       `json:"error"`
}

// qmpMessage is any message QEMU sends.
type qmpMessage struct {
	qmpReply
	ID        json.RawMessage `json:"id"`
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp *struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
	QMP json.RawMessage `json:"QMP"`
}

// DialQMP connects to the QMP socket at path, reads the greeting and
// leaves negotiation mode (qmp_capabilities). ctx bounds the handshake.
func DialQMP(ctx context.Context, path string) (*QMP, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("connecting to qmp: %w", err)
	}
	q, err := NewQMP(ctx, conn)
	if err != nil {
		return nil, err
	}
	return q, nil
}

// NewQMP runs the QMP handshake on conn and starts reading it. It takes
// ownership of conn: it is closed on failure and by Close.
func NewQMP(ctx context.Context, conn net.Conn) (*QMP, error) {
	q := &QMP{
		conn:    conn,
		events:  make(chan Event, eventBuffer),
		done:    make(chan struct{}),
		pending: make(map[string]chan qmpReply),
	}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 0, 4096), maxQMPMessage)
	// The greeting is read before the reader goroutine exists; ctx's
	// deadline becomes the connection's.
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Unix(1, 0)) })
	ok := sc.Scan()
	stop()
	conn.SetReadDeadline(time.Time{})
	if !ok {
		conn.Close()
		err := sc.Err()
		if err == nil {
			err = ErrQMPClosed
		}
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("reading the qmp greeting: %w", err)
	}
	var g qmpMessage
	if err := json.Unmarshal(sc.Bytes(), &g); err != nil || g.QMP == nil {
		conn.Close()
		return nil, fmt.Errorf("reading the qmp greeting: not a greeting: %.200q", sc.Bytes())
	}
	q.Greeting = g.QMP
	go q.read(sc)
	if err := q.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

// read delivers replies and events until the connection fails. It owns
// nothing but the scanner; it ends when conn is closed.
func (q *QMP) read(sc *bufio.Scanner) {
	var err error
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var m qmpMessage
		if err = json.Unmarshal(sc.Bytes(), &m); err != nil {
			err = fmt.Errorf("decoding a qmp message: %w", err)
			break
		}
		switch {
		case m.Event != "":
			ev := Event{Name: m.Event, Data: m.Data}
			if m.Timestamp != nil {
				ev.Time = time.Unix(m.Timestamp.Seconds, m.Timestamp.Microseconds*1000)
			}
			select {
			case q.events <- ev:
			default:
				q.mu.Lock()
				q.dropped++
				q.mu.Unlock()
			}
		case m.ID != nil:
			var id string
			if json.Unmarshal(m.ID, &id) != nil {
				continue // not one of ours
			}
			q.mu.Lock()
			ch := q.pending[id]
			delete(q.pending, id)
			q.mu.Unlock()
			if ch != nil {
				ch <- m.qmpReply // buffered
			}
		}
	}
	if err == nil {
		err = sc.Err()
	}
	if err == nil {
		err = ErrQMPClosed
	}
	q.mu.Lock()
	q.err = err
	for id, ch := range q.pending {
		close(ch)
		delete(q.pending, id)
	}
	q.mu.Unlock()
	close(q.events)
	close(q.done)
}

// Execute runs the QMP command cmd with args (nil for none; anything that
// marshals to a JSON object) and decodes its return value into out (nil to
// ignore it). QEMU's own errors are *QMPError; a connection that closes
// first gives an error wrapping ErrQMPClosed.
func (q *QMP) Execute(ctx context.Context, cmd string, args, out any) error {
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		return fmt.Errorf("qmp %s: %w", cmd, ErrQMPClosed)
	}
	q.nextID++
	id := "dsec-" + strconv.FormatUint(q.nextID, 10)
	ch := make(chan qmpReply, 1)
	q.pending[id] = ch
	q.mu.Unlock()

	msg := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        string `json:"id"`
	}{cmd, args, id}
	b, err := json.Marshal(msg)
	if err != nil {
		q.forget(id)
		return fmt.Errorf("qmp %s: encoding arguments: %w", cmd, err)
	}
	b = append(b, '\n')
	q.wmu.Lock()
	if dl, ok := ctx.Deadline(); ok {
		q.conn.SetWriteDeadline(dl)
	}
	_, err = q.conn.Write(b)
	q.conn.SetWriteDeadline(time.Time{})
	q.wmu.Unlock()
	if err != nil {
		q.forget(id)
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return fmt.Errorf("qmp %s: %w", cmd, ErrQMPClosed)
		}
		if r.Error != nil {
			r.Error.Command = cmd
			return r.Error
		}
		if out != nil && r.Return != nil {
			if err := json.Unmarshal(r.Return, out); err != nil {
				return fmt.Errorf("qmp %s: decoding the reply: %w", cmd, err)
			}
		}
		return nil
	case <-ctx.Done():
		q.forget(id)
		return fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
	}
}

func (q *QMP) forget(id string) {
	q.mu.Lock()
	delete(q.pending, id)
	q.mu.Unlock()
}

// Events delivers QEMU's asynchronous events in order. It is closed when
// the connection ends. The reader never blocks on it: events that find its
// buffer full are dropped and counted (Dropped), so a consumer that needs
// every event must keep reading.
func (q *QMP) Events() <-chan Event { return q.events }

// Dropped returns how many events were dropped because Events was full.
func (q *QMP) Dropped() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dropped
}

// Done is closed when the connection has ended (QEMU exited or Close).
func (q *QMP) Done() <-chan struct{} { return q.done }

// Close closes the connection and waits for the reader to stop. Pending
// commands fail with ErrQMPClosed. QEMU keeps running.
func (q *QMP) Close() error {
	err := q.conn.Close()
	<-q.done
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Status is the reply of query-status.
type Status struct {
	Status  string `json:"status"` // "running", "paused", "prelaunch", "shutdown", "internal-error"…
	Running bool   `json:"running"`
}

// QueryStatus runs query-status.
func (q *QMP) QueryStatus(ctx context.Context) (Status, error) {
	var s Status
	err := q.Execute(ctx, "query-status", nil, &s)
	return s, err
}

// KVMStatus is the reply of query-kvm.
type KVMStatus struct {
	Enabled bool `json:"enabled"`
	Present bool `json:"present"`
}

// QueryKVM runs query-kvm.
func (q *QMP) QueryKVM(ctx context.Context) (KVMStatus, error) {
	var s KVMStatus
	err := q.Execute(ctx, "query-kvm", nil, &s)
	return s, err
}
