// Package builtin provides the images that come with dsec, so that
// `dsec up` works with nothing else to install or build by hand. They are
// layers (see Specs and Ensure): base/busybox (Debian's busybox-static),
// base/debian-12 (debootstrap minbase from the host's Debian mirror),
// toolkit/dsec-guest (the in-sandbox agent) and toolkit/wasm-tools (the
// function tier's example tools). The dsec binary embeds the compiled
// guest and tools (`make build` puts them in assets/); a binary built
// without them compiles them from the source tree.
package builtin

import "embed"

//go:embed all:assets
var assets embed.FS
