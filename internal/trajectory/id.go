package trajectory

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"strings"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// MaxIDLen is the longest trajectory ID, in bytes.
const MaxIDLen = 200

// ValidID checks a trajectory ID: 1..200 bytes of letters, digits and
// "-_./:", no "..", no leading or trailing "/". IDs name paths of runs
// ("run-42/task-7/rollout-3"), so the rules are those of a relative path
// that cannot climb.
func ValidID(id string) error {
	bad := func(why string) error {
		return errdefs.New(errdefs.Invalid, api.CodeInvalidTrajectoryID, "trajectory ID %q: %s", id, why)
	}
	switch {
	case id == "":
		return errdefs.New(errdefs.Invalid, api.CodeInvalidTrajectoryID, "trajectory ID is empty")
	case len(id) > MaxIDLen:
		return errdefs.New(errdefs.Invalid, api.CodeInvalidTrajectoryID, "trajectory ID is longer than %d bytes", MaxIDLen)
	case strings.Contains(id, ".."):
		return bad(`contains ".."`)
	case strings.HasPrefix(id, "/") || strings.HasSuffix(id, "/"):
		return bad(`starts or ends with "/"`)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_./:", c) >= 0) {
			return bad("only letters, digits and -_./: are allowed")
		}
	}
	return nil
}

var idEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// NewID names a trajectory for a create with record=true: "traj-" and 20
// random base32 characters (100 bits).
func NewID() string {
	var b [13]byte
	rand.Read(b[:])
	return "traj-" + strings.ToLower(idEncoding.EncodeToString(b[:]))[:20]
}

// key is the subject- and KV-safe form of an ID: IDs hold '/', '.' and
// ':', which NATS subjects and KV keys cannot. 16 bytes of sha256 make a
// collision as unlikely as a random UUID's.
func key(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:16])
}

// subject is where a trajectory's steps are published.
func subject(id string) string { return SubjectPrefix + key(id) }
