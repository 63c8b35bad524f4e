// Package audit turns what the node's eBPF monitor (package monitor) sees
// in sandboxes into audit events: each attributed to its sandbox and
// phase, given a verdict (allowed, denied, failed) and the first rule it
// hits (rules.json, extended by the operator), and published to the
// JetStream stream "audit", one subject per sandbox, which the API reads
// (GET /v1/sandboxes/{id}/events, /integrity).
package audit
