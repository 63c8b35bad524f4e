#!/usr/bin/env bash
# Measures the function tier's create → exec → delete cycle through the API
# for an earlier revision and for this tree, alternating (old, new, old,
# new …) so that both sides see the same machine, and prints each pair's
# ratio. This machine's speed moves by tens of per cent between hours: a
# figure against a figure of another day says little, a ratio of
# neighbouring runs says whether the code moved.
#   scripts/bench-vs.sh REV [PAIRS] [CLIENTS…]
# REV is built in a temporary worktree. Both sides run under this tree's
# scripts/bench.sh (its config needs a revision from 2026-12-01 or later).
set -euo pipefail
rev=${1:?usage: scripts/bench-vs.sh REV [PAIRS] [CLIENTS…]}
pairs=${2:-5}
shift $(($# < 2 ? $# : 2))
clients=("${@:-2}")
top=$(git rev-parse --show-toplevel)
cd "$top"
make build >/dev/null
tree=$(mktemp -d /tmp/dsec-vs.XXXXXX)
cleanup() { git worktree remove --force "$tree" >/dev/null 2>&1 || rm -rf "$tree"; }
trap cleanup EXIT
git worktree add --detach "$tree" "$rev" >/dev/null 2>&1
make -C "$tree" build >/dev/null
rate() {
	local out
	out=$(scripts/bench.sh "$1" --scenarios create-exec-delete --concurrency "$2" --duration 10s 2>&1) || { echo "$out" >&2; return 1; }
	awk '$1 == "create-exec-delete" && $5 ~ /^[0-9]+$/ { print $5 }' <<<"$out"
}
printf '%8s %5s %10s %10s %7s\n' clients pair "$rev" this ratio
for c in "${clients[@]}"; do
	for i in $(seq "$pairs"); do
		old=$(rate "$tree/bin/dsec" "$c")
		new=$(rate "$top/bin/dsec" "$c")
		printf '%8s %5s %10s %10s %7.3f\n' "$c" "$i" "$old" "$new" "$(echo "$new / $old" | bc -l)"
	done
done
