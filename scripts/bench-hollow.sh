#!/usr/bin/env bash
# Measures the control plane over hollow nodes: a `dsec up` whose own node
# runs no VM tier, and `dsec node --hollow N` joined to it, which offers
# every tier; `dsec bench` then creates vm sandboxes, which only the
# hollow nodes take, so the figures are the control plane's and the node
# protocol's, not a tier's. The token's limits are lifted: the load is
# one client's.
#   scripts/bench-hollow.sh BIN NODES [dsec bench flags]
set -euo pipefail
bin=${1:?usage: scripts/bench-hollow.sh BIN NODES [flags]}
nodes=${2:?usage: scripts/bench-hollow.sh BIN NODES [flags]}
shift 2
dir=$(mktemp -d /tmp/dsec-hollow.XXXXXX)
chmod 711 "$dir"
cat >"$dir/dsec.toml" <<'TOML'
version = 1
[container]
name = "dhollow"
network_range = "10.87.0.0/16"
cgroup_parent = "dsec-hollow"
[microvm]
disabled = true
[vm]
disabled = true
[limits]
max_sandboxes_per_token = 1000000
creates_per_second = 100000
create_burst = 100000
TOML
DSEC_SKIP_SLOW_IMAGES=true "$bin" up --config "$dir/dsec.toml" --data-dir "$dir/data" --listen 127.0.0.1:0 --nats-listen 127.0.0.1:0 >"$dir/up.log" 2>&1 &
up=$!
hollow=""
cleanup() {
	[ -n "$hollow" ] && { kill -TERM "$hollow" 2>/dev/null || true; wait "$hollow" 2>/dev/null || true; }
	kill -TERM "$up" 2>/dev/null || true
	wait "$up" 2>/dev/null || true
	rm -rf "$dir"
	rmdir /sys/fs/cgroup/*/dsec-hollow /sys/fs/cgroup/dsec-hollow 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 600); do
	grep -q "NATS:" "$dir/up.log" 2>/dev/null && [ -s "$dir/data/api.addr" ] && break
	kill -0 "$up" 2>/dev/null || { cat "$dir/up.log"; exit 1; }
	sleep 0.1
done
nats=$(sed -n 's/^  NATS: *//p' "$dir/up.log" | head -1)
"$bin" node --hollow "$nodes" --node-id fleet --data-dir "$dir/hollow" --nats-url "$nats" --nats-token "$(cat "$dir/data/nats.token")" >"$dir/hollow.log" 2>&1 &
hollow=$!
for _ in $(seq 600); do
	grep -q "DSec node is up" "$dir/hollow.log" 2>/dev/null && break
	kill -0 "$hollow" 2>/dev/null || { cat "$dir/hollow.log"; exit 1; }
	sleep 0.1
done
sleep 3 # a heartbeat of every hollow node reaches the control plane
"$bin" bench --url "http://$(cat "$dir/data/api.addr")" --data-dir "$dir/data" --server-pid "$up" --burst-tier vm "$@"
