package redact

import (
	"regexp"
	"strings"
)

// hostAndPath matches a host name, a port and a path without ':' or spaces.
var hostAndPath = regexp.MustCompile(`^[A-Za-z0-9.-]+(?::[0-9]+)?/[^\s:@]*$`)

// urlStart finds where a URL begins in free text.
var urlStart = regexp.MustCompile(`(?i)[a-z][a-z0-9+.-]*://`)

// Text removes secrets from text that may contain URLs, database URLs or
// keyword/value strings (error messages, failure reasons). Of a
// postgres:// or postgresql:// URL (in any case) only the user name is
// kept, and nothing after it in the text: where such a URL ends in free
// text cannot be told (a password may hold a space). Of a URL of another
// scheme the user information and the secret-looking query parameters are
// masked. Every keyword whose name contains "pass" has its value masked.
func Text(text string) string {
	var b strings.Builder
	for {
		loc := urlStart.FindStringIndex(text)
		if loc == nil {
			break
		}
		b.WriteString(redactKeywords(text[:loc[0]]))
		scheme := strings.ToLower(text[loc[0]:loc[1]])
		rest := text[loc[1]:]
		if strings.Contains(scheme, "postgres") {
			b.WriteString(text[loc[0]:loc[1]] + userRun(rest))
			if userRun(rest) != rest {
				b.WriteString("…")
			}
			return b.String()
		}
		// The user information of another URL, even cut by a space: up
		// to the last '@' before the next URL, unless what comes before
		// that '@' is plainly a host and a path (https://host/@name).
		region := rest
		if next := urlStart.FindStringIndex(rest); next != nil {
			region = rest[:next[0]]
		}
		masked := maskLoose(region) // first: an '@' in a secret value is no separator
		if at := strings.LastIndex(masked, "@"); at >= 0 {
			if !hostAndPath.MatchString(masked[:at]) {
				b.WriteString(text[loc[0]:loc[1]] + Mask + redactKeywords(masked[at:]))
				text = rest[len(region):]
				continue
			}
		}
		end := strings.IndexAny(rest, " \t\r\n`\"'<>")
		if end < 0 {
			end = len(rest)
		}
		b.WriteString(text[loc[0]:loc[1]] + maskLoose(rest[:end]))
		text = rest[end:]
	}
	b.WriteString(redactKeywords(text))
	return b.String()
}

// maskLoose masks the secret-looking parameters of a URL found in free
// text, and any secret-looking key=value pair in it even without a '?'
// before: free text may cut a URL where a nested one begins
// (?next=https://…&token=…).
func maskLoose(s string) string { return maskPairs(maskParams(s)) }

// Error returns err with its message passed through Text (pgx's own errors
// may echo a URL with its password) and its chain kept, so errors.Is and
// errors.As still see what it wraps; nil stays nil.
func Error(err error) error {
	if err == nil {
		return nil
	}
	return redactedError{err}
}

type redactedError struct{ err error }

func (e redactedError) Error() string { return Text(e.err.Error()) }
func (e redactedError) Unwrap() error { return e.err }
