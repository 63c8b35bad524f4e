package agentproto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Protocol is the version of the protocol this package speaks. A peer
// that says another version in Hello is refused.
const Protocol = 1

// Limits of the framing. Both ends enforce them on what they read.
const (
	// HeaderSize is the size of a frame header.
	HeaderSize = 12
	// MaxPayload bounds a frame's payload; larger data is sent in chunks.
	MaxPayload = 1 << 20
	// MaxControlPayload bounds the payload of Window, Event and Cancel
	// frames, which carry small JSON or nothing.
	MaxControlPayload = 64 << 10
	// InitialWindow is the credit each side of a call starts with for the
	// data it may send before the receiver grants more (see Window).
	InitialWindow = 256 << 10
	// MaxWindow bounds the credit a receiver may have outstanding.
	MaxWindow = 16 << 20
	// ChunkSize is the size of the data frames this package sends.
	ChunkSize = 32 << 10
)

// FrameType says what a frame carries.
type FrameType uint8

// Frame types.
const (
	// FrameOpen starts a call (node → agent): a JSON Request. The stream
	// id is new and chosen by the node.
	FrameOpen FrameType = 1
	// FrameData carries raw bytes of one channel of a call, in both
	// directions, within the receiver's window. FlagEOF ends the channel.
	FrameData FrameType = 2
	// FrameWindow grants the peer more credit for data on a call: a
	// 4-byte big-endian increment.
	FrameWindow FrameType = 3
	// FrameEvent is a JSON message in the middle of a call (agent → node),
	// e.g. the pid of a started command or the FileInfo of an opened file.
	FrameEvent FrameType = 4
	// FrameReply ends a call (agent → node): a JSON Reply.
	FrameReply FrameType = 5
	// FrameCancel asks the agent to abandon a call (node → agent): the
	// command is killed, the file operation stopped. No payload.
	FrameCancel FrameType = 6
)

func (t FrameType) String() string {
	switch t {
	case FrameOpen:
		return "open"
	case FrameData:
		return "data"
	case FrameWindow:
		return "window"
	case FrameEvent:
		return "event"
	case FrameReply:
		return "reply"
	case FrameCancel:
		return "cancel"
	}
	return fmt.Sprintf("frame-type-%d", uint8(t))
}

// Channel numbers a call's byte streams in Data frames.
type Channel uint8

// Channels.
const (
	// ChanIn is data towards the agent: a command's stdin, a file's content.
	ChanIn Channel = 0
	// ChanOut is data from the agent: stdout (merged output with a PTY), a
	// file's content, JSON list chunks.
	ChanOut Channel = 1
	// ChanErr is a command's stderr.
	ChanErr Channel = 2
)

// Flags.
const (
	// FlagEOF on a Data frame: no more data on its channel.
	FlagEOF uint8 = 1
)

// Frame is one frame. Its header on the wire, 12 bytes, big-endian:
//
//	0      1        2       3         4 ............ 7   8 ........... 11
//	type   channel  flags   reserved  stream id (u32)    payload length (u32)
//
// followed by length bytes of payload. Reserved must be 0; channel and
// flags must be 0 on frames other than Data.
type Frame struct {
	Type    FrameType
	Channel Channel
	Flags   uint8
	Stream  uint32
	Payload []byte
}

// ErrFrame is wrapped by the errors ReadFrame returns for a malformed
// frame (as opposed to an I/O error): the peer does not speak the
// protocol and the connection must be dropped.
var ErrFrame = errors.New("malformed frame")

// maxPayload returns the payload bound of frames of type t.
func maxPayload(t FrameType) int {
	switch t {
	case FrameOpen, FrameData, FrameReply:
		return MaxPayload
	case FrameWindow:
		return 4
	case FrameCancel:
		return 0
	}
	return MaxControlPayload
}

// ReadFrame reads one frame from r. It validates the header before it
// allocates anything, so a hostile peer can make it allocate at most
// MaxPayload bytes per frame. hdr is scratch space for the header.
func ReadFrame(r io.Reader, hdr *[HeaderSize]byte) (Frame, error) {
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Frame{}, err
	}
	f := Frame{
		Type:    FrameType(hdr[0]),
		Channel: Channel(hdr[1]),
		Flags:   hdr[2],
		Stream:  binary.BigEndian.Uint32(hdr[4:8]),
	}
	n := binary.BigEndian.Uint32(hdr[8:12])
	if err := f.checkHeader(hdr[3], n); err != nil {
		return Frame{}, err
	}
	if n > 0 {
		f.Payload = make([]byte, n)
		if _, err := io.ReadFull(r, f.Payload); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return Frame{}, err
		}
	}
	return f, nil
}

func (f *Frame) checkHeader(reserved uint8, n uint32) error {
	if f.Type < FrameOpen || f.Type > FrameCancel {
		return fmt.Errorf("%w: unknown type %d", ErrFrame, f.Type)
	}
	if reserved != 0 {
		return fmt.Errorf("%w: reserved byte %#x", ErrFrame, reserved)
	}
	if f.Type == FrameData {
		if f.Channel > ChanErr || f.Flags&^FlagEOF != 0 {
			return fmt.Errorf("%w: data channel %d flags %#x", ErrFrame, f.Channel, f.Flags)
		}
	} else if f.Channel != 0 || f.Flags != 0 {
		return fmt.Errorf("%w: %s frame with channel %d flags %#x", ErrFrame, f.Type, f.Channel, f.Flags)
	}
	if f.Stream == 0 {
		return fmt.Errorf("%w: stream id 0", ErrFrame)
	}
	if int64(n) > int64(maxPayload(f.Type)) {
		return fmt.Errorf("%w: %s payload of %d bytes (limit %d)", ErrFrame, f.Type, n, maxPayload(f.Type))
	}
	if f.Type == FrameWindow && n != 4 {
		return fmt.Errorf("%w: window payload of %d bytes", ErrFrame, n)
	}
	return nil
}

// AppendHeader appends f's header to b.
func (f *Frame) AppendHeader(b []byte) []byte {
	var h [HeaderSize]byte
	h[0] = byte(f.Type)
	h[1] = byte(f.Channel)
	h[2] = f.Flags
	binary.BigEndian.PutUint32(h[4:8], f.Stream)
	binary.BigEndian.PutUint32(h[8:12], uint32(len(f.Payload)))
	return append(b, h[:]...)
}

// WriteFrame writes f to w after checking it against the limits ReadFrame
// enforces.
func WriteFrame(w io.Writer, f Frame) error {
	if err := f.checkHeader(0, uint32(min(len(f.Payload), MaxPayload+1))); err != nil {
		return err
	}
	var h [HeaderSize]byte
	if _, err := w.Write(f.AppendHeader(h[:0])); err != nil {
		return err
	}
	if len(f.Payload) > 0 {
		if _, err := w.Write(f.Payload); err != nil {
			return err
		}
	}
	return nil
}

// windowPayload encodes a credit increment.
func windowPayload(n uint32) []byte {
	return binary.BigEndian.AppendUint32(nil, n)
}
