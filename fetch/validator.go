package fetch

import (
	"unicode"
	"unicode/utf8"
)

// MaxValidatorLen caps an ETag or Last-Modified value, in bytes. Real ones
// are far shorter (a Last-Modified date is 29 bytes; a quoted SHA-256 hex
// ETag 66, a weak quoted SHA-512 hex one 132); the cap leaves room for any
// of them while bounding what a destination can make fleetpace store per
// source and send back, as If-None-Match, on every fetch.
const MaxValidatorLen = 512

// SanitizeValidator returns v if it is fit to keep as a validator and send
// back in a request header: valid UTF-8 (PostgreSQL text rejects anything
// else, failing the whole batch the check is written in), no control
// characters (neither header's grammar has any; PostgreSQL cannot store NUL
// and net/http refuses to send most of the others),
// at most MaxValidatorLen bytes. Otherwise it returns "": an invalid
// validator is dropped, as if the destination had sent none, which costs at
// most one unconditional fetch.
func SanitizeValidator(v string) string {
	if len(v) > MaxValidatorLen || !utf8.ValidString(v) {
		return ""
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return ""
		}
	}
	return v
}
