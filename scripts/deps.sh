#!/usr/bin/env bash
# Installs the Debian packages DSec needs, only those missing.
#   scripts/deps.sh runtime   what `dsec up` needs (qemu-system-x86 brings
#                             qemu-system-data, with the microvm firmware,
#                             and seabios, the vm tier's q35 firmware
#                             bios-256k.bin, as dependencies; e2fsprogs
#                             formats the VM tiers' upper disks; util-linux,
#                             essential on Debian, has the unshare that runs
#                             the debian-12 build in namespaces of its own)
#   scripts/deps.sh test      what `make test` needs on top, crun and runc
#                             among them: the baselines the container tier
#                             is measured against (`make test` runs every
#                             benchmark once); mypy type-checks the Python
#                             SDK (its own stdlib stubs suffice: typeshed,
#                             a recommend, is not needed)
#   scripts/deps.sh bench     what `make bench` needs: the test set
#   scripts/deps.sh generate  what `go generate` needs to rebuild the eBPF
#                             objects (internal/monitor, internal/guard):
#                             clang and libbpf's headers. Building and
#                             testing need neither: the objects are committed.
set -euo pipefail

runtime=(ca-certificates erofs-utils busybox-static debootstrap util-linux qemu-system-x86 e2fsprogs)
test=(python3 python3-minimal python3-httpx python3-pytest python3-pytest-asyncio mypy wabt erofs-utils attr iproute2 crun runc)
generate=(clang libbpf-dev linux-libc-dev)

want=("${runtime[@]}")
case "${1:-runtime}" in
runtime) ;;
test) want+=("${test[@]}") ;;
bench) want+=("${test[@]}") ;;
generate) want=("${generate[@]}") ;;
*)
	echo "usage: scripts/deps.sh [runtime|test|bench|generate]" >&2
	exit 2
	;;
esac

missing=()
for p in "${want[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
	exit 1
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
