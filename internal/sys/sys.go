// Package sys is DSec's one gateway to Linux system calls: every use of
// golang.org/x/sys/unix goes through here (a test enforces it), so the
// calls DSec makes into the kernel can be read, reviewed and stubbed for
// other systems in one place. Off Linux the functions return errors
// wrapping errdefs.ErrNotSupported.
package sys
