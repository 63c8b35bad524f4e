package builtin

// GuestBinary returns the dsec-guest binary: the one this binary embeds
// (`make build`), or else compiled from the source tree with version
// buildVersion. The microVM tiers' initramfs runs it as /init.
func GuestBinary(buildVersion string) ([]byte, error) {
	return guestBinary(buildVersion)
}
