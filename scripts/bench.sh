#!/usr/bin/env bash
# Starts a fresh `dsec up` on a temporary data directory, runs `dsec bench`
# against it through the API (a separate process, as users would), prints
# the table, and stops the server.
#   scripts/bench.sh BIN [dsec bench flags…]
set -euo pipefail
bin=${1:?usage: scripts/bench.sh BIN [flags]}
shift
dir=$(mktemp -d /tmp/dsec-bench.XXXXXX)
# Container sandboxes run as an unprivileged host uid that must walk down
# to their roots in the data directory.
chmod 711 "$dir"
log=$dir/server.log
# The container tier under names of its own (apart from any other DSec on
# the host); the VM tiers off: on a fresh data directory they build their
# guest kernel in the background, which would share the cores with what
# is measured.
cat >"$dir/dsec.toml" <<'EOF'
version = 1
[container]
name = "dbench"
network_range = "10.89.0.0/16"
cgroup_parent = "dsec-bench"
[microvm]
disabled = true
[vm]
disabled = true
EOF
# The slow built-in (debian-12, debootstrap) would build in the background
# during the measurements. The log level is the default (info), what users
# run.
DSEC_SKIP_SLOW_IMAGES=true "$bin" up --config "$dir/dsec.toml" --data-dir "$dir/data" --listen 127.0.0.1:0 --nats-listen none >"$log" 2>&1 &
pid=$!
cleanup() {
	kill -TERM "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	rm -rf "$dir"
	# The node leaves its cgroup parent, empty, when it stops.
	rmdir /sys/fs/cgroup/*/dsec-bench /sys/fs/cgroup/dsec-bench 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 600); do
	[ -s "$dir/data/api.addr" ] && break
	kill -0 "$pid" 2>/dev/null || { cat "$log"; exit 1; }
	sleep 0.1
done
addr=$(cat "$dir/data/api.addr")
"$bin" bench --url "http://$addr" --data-dir "$dir/data" --server-pid "$pid" "$@"
