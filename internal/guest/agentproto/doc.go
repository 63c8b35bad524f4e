// Package agentproto is the protocol between the node service and the agent
// inside a sandbox (dsec-guest): framing, multiplexing, flow control and
// messages, the node's Client and the agent's Serve. It runs over any
// io.ReadWriteCloser carrying one byte stream: a Unix socket to a
// container's agent, a virtio-serial port to a VM's.
//
// # Frames
//
// Every frame is a 12-byte header and a payload (see Frame):
//
//	type(1) channel(1) flags(1) reserved(1) stream(4) length(4)
//
// big-endian, payload at most 1 MiB (MaxPayload; 64 KiB for events, 4
// bytes for window updates, none for cancels). Larger data is chunked
// (32 KiB data frames). The reader checks the header before allocating.
//
// # Calls
//
// The node opens a call with an Open frame on a new stream id carrying a
// JSON Request {op, args}. Then, on that stream: Data frames in both
// directions (ChanIn towards the agent: stdin, uploads; ChanOut and ChanErr
// from it: output, downloads, NDJSON listings), FlagEOF on the last Data
// frame of a channel; Event frames from the agent (a command's pid, an
// opened file's FileInfo); and one Reply frame {error | result} that ends
// the call. The node may send Cancel to abandon a call: the agent kills
// the command or stops the file operation and still replies, and the node,
// which has forgotten the call, drops whatever arrives for it. The first
// call on a connection is Hello, which checks the protocol version and
// returns the agent's version, pid and capabilities. Errors travel as
// class + code + message and are rebuilt into errdefs errors.
//
// # Flow control
//
// Credit-based, per call and per direction: each side may send at most
// InitialWindow (256 KiB) of Data payload on a call before the receiver
// grants more with a Window frame (a 4-byte increment). The receiver
// grants credit back as its consumer takes data off the call's queue, in
// steps of a quarter window. One goroutine reads the connection and files
// each frame into its call's queue without ever blocking, so a consumer
// that stops reading one call (a slow Output callback, a download nobody
// reads) stalls that call alone: its sender runs out of credit, the
// command behind it blocks on its pipe, and every other call proceeds.
// What a call may queue is bounded by its window plus a few control
// frames; a peer that sends beyond its credit, a malformed frame or an
// undecodable message breaks the protocol and the connection is closed.
//
// # Trust
//
// The agent runs inside the sandbox and is treated as hostile by the
// Client: bounded frames and JSON, output capped at the request's cap
// whatever the agent sends, contexts and default timeouts on every call
// (a silent agent cannot hang the node), and a closed connection fails
// all calls at once with errdefs.Unavailable ("agent_gone").
package agentproto
