#!/usr/bin/env bash
# Starts a fresh `dsec up` on a temporary data directory, runs `dsec bench`
# against it through the API (a separate process, as users would), prints
# the table, and stops the server.
#   scripts/bench.sh BIN [dsec bench flags…]
set -euo pipefail
bin=${1:?usage: scripts/bench.sh BIN [flags]}
shift
dir=$(mktemp -d /tmp/dsec-bench.XXXXXX)
# mktemp makes it 0700; container sandboxes (their own uids) must walk
# through it to their roots.
chmod 0755 "$dir"
log=$dir/server.log
# The slow built-in (debian-12, debootstrap) would build in the background
# during the measurements.
DSEC_SKIP_SLOW_IMAGES=true "$bin" up --data-dir "$dir/data" --listen 127.0.0.1:0 --nats-listen none --log-level warn >"$log" 2>&1 &
pid=$!
cleanup() {
	kill -TERM "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 600); do
	[ -s "$dir/data/api.addr" ] && break
	kill -0 "$pid" 2>/dev/null || { cat "$log"; exit 1; }
	sleep 0.1
done
addr=$(cat "$dir/data/api.addr")
"$bin" bench --url "http://$addr" --data-dir "$dir/data" --server-pid "$pid" "$@"
