package agentproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestFrameRoundTrip(t *testing.T) {
	frames := []Frame{
		{Type: FrameOpen, Stream: 1, Payload: []byte(`{"op":"hello"}`)},
		{Type: FrameData, Channel: ChanErr, Flags: FlagEOF, Stream: 7, Payload: []byte("err")},
		{Type: FrameData, Channel: ChanIn, Stream: 1 << 31},
		{Type: FrameWindow, Stream: 3, Payload: windowPayload(65536)},
		{Type: FrameEvent, Stream: 3, Payload: []byte(`{"pid":1}`)},
		{Type: FrameReply, Stream: 3, Payload: bytes.Repeat([]byte("x"), MaxPayload)},
		{Type: FrameCancel, Stream: 9},
	}
	var buf bytes.Buffer
	for _, f := range frames {
		if err := WriteFrame(&buf, f); err != nil {
			t.Fatalf("WriteFrame(%v): %v", f.Type, err)
		}
	}
	var hdr [HeaderSize]byte
	for _, want := range frames {
		got, err := ReadFrame(&buf, &hdr)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b []byte) bool { return bytes.Equal(a, b) })); diff != "" {
			t.Errorf("round trip (-want +got):\n%s", diff)
		}
	}
	if _, err := ReadFrame(&buf, &hdr); err != io.EOF {
		t.Errorf("at the end: %v, want EOF", err)
	}
}

func header(typ, ch, flags, reserved byte, stream, length uint32) []byte {
	b := []byte{typ, ch, flags, reserved}
	b = binary.BigEndian.AppendUint32(b, stream)
	return binary.BigEndian.AppendUint32(b, length)
}

func TestReadFrameRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"unknown type", header(99, 0, 0, 0, 1, 0)},
		{"type zero", header(0, 0, 0, 0, 1, 0)},
		{"reserved byte", header(byte(FrameData), 0, 0, 1, 1, 0)},
		{"stream zero", header(byte(FrameOpen), 0, 0, 0, 0, 2)},
		{"oversized data", header(byte(FrameData), 1, 0, 0, 1, MaxPayload+1)},
		{"huge length", header(byte(FrameReply), 0, 0, 0, 1, 0xffffffff)},
		{"oversized event", header(byte(FrameEvent), 0, 0, 0, 1, MaxControlPayload+1)},
		{"short window", header(byte(FrameWindow), 0, 0, 0, 1, 3)},
		{"cancel with payload", header(byte(FrameCancel), 0, 0, 0, 1, 1)},
		{"bad channel", header(byte(FrameData), 3, 0, 0, 1, 0)},
		{"bad flags", header(byte(FrameData), 1, 2, 0, 1, 0)},
		{"channel on open", header(byte(FrameOpen), 1, 0, 0, 1, 0)},
		{"flags on reply", header(byte(FrameReply), 0, 1, 0, 1, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hdr [HeaderSize]byte
			// The payload is never there: a rejected header must not read it.
			_, err := ReadFrame(bytes.NewReader(tc.in), &hdr)
			if !errors.Is(err, ErrFrame) {
				t.Errorf("ReadFrame = %v, want ErrFrame", err)
			}
		})
	}
	var hdr [HeaderSize]byte
	if _, err := ReadFrame(bytes.NewReader(append(header(byte(FrameReply), 0, 0, 0, 1, 10), "short"...)), &hdr); err != io.ErrUnexpectedEOF {
		t.Errorf("truncated payload: %v, want ErrUnexpectedEOF", err)
	}
	if _, err := ReadFrame(bytes.NewReader([]byte{1, 2, 3}), &hdr); err != io.ErrUnexpectedEOF {
		t.Errorf("truncated header: %v, want ErrUnexpectedEOF", err)
	}
	if err := WriteFrame(io.Discard, Frame{Type: FrameData, Stream: 1, Payload: make([]byte, MaxPayload+1)}); !errors.Is(err, ErrFrame) {
		t.Errorf("WriteFrame of an oversized frame: %v", err)
	}
}

// FuzzFrameReader feeds arbitrary bytes to the frame decoder: it must not
// panic or allocate past the limits, and every frame it accepts must
// survive a round trip.
func FuzzFrameReader(f *testing.F) {
	var seed bytes.Buffer
	WriteFrame(&seed, Frame{Type: FrameOpen, Stream: 1, Payload: []byte(`{"op":"exec"}`)})
	WriteFrame(&seed, Frame{Type: FrameData, Channel: ChanOut, Flags: FlagEOF, Stream: 1, Payload: []byte("out")})
	WriteFrame(&seed, Frame{Type: FrameWindow, Stream: 1, Payload: windowPayload(1)})
	f.Add(seed.Bytes())
	f.Add(header(byte(FrameReply), 0, 0, 0, 1, 0xffffffff))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		var hdr [HeaderSize]byte
		for {
			fr, err := ReadFrame(r, &hdr)
			if err != nil {
				return
			}
			if len(fr.Payload) > maxPayload(fr.Type) {
				t.Fatalf("accepted a %s frame of %d bytes", fr.Type, len(fr.Payload))
			}
			var buf bytes.Buffer
			if err := WriteFrame(&buf, fr); err != nil {
				t.Fatalf("re-encoding an accepted frame: %v", err)
			}
			back, err := ReadFrame(&buf, &hdr)
			if err != nil || back.Type != fr.Type || back.Stream != fr.Stream || back.Channel != fr.Channel || back.Flags != fr.Flags || !bytes.Equal(back.Payload, fr.Payload) {
				t.Fatalf("round trip of %+v: %+v, %v", fr, back, err)
			}
		}
	})
}
