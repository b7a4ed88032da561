// Package redact is what of a URL, a database connection string or a
// message may be printed: every page, log line, error and JSON output of
// fleetpace shows URLs through URL and messages through Text.
//
// Three kinds of secret are hidden: the user information of a URL
// (https://user:xxxxx@host/…), the values of query parameters whose names
// look secret (?api_key=xxxxx, configurable with SetSecretParams), and
// database passwords, under the stricter rules of database.go: a database
// URL that cannot be read one way only is shown up to its user name.
package redact

import (
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
)

// Mask replaces a secret in what this package returns.
const Mask = "xxxxx"

// DefaultSecretParams are the query parameter names whose values are hidden
// by default (see SetSecretParams for how a name matches).
var DefaultSecretParams = []string{
	"api_key", "apikey", "key", "token", "access_token", "auth", "password", "passwd", "pwd",
	"secret", "sig", "signature", "credential", "session", "sessionid", "session_id", "jwt",
}

var secretParams atomic.Pointer[[]string]

func init() { secretParams.Store(normalizeAll(DefaultSecretParams)) }

// SecretParams returns the query parameter names whose values are hidden.
func SecretParams() []string { return append([]string(nil), *secretParams.Load()...) }

// SetSecretParams replaces, for the whole process, the query parameter
// names whose values are hidden (DefaultSecretParams until it is called).
// A parameter matches a name when its own name, %-decoded, in any case and
// with '-' read as '_', is the name or ends with '_' + the name: "token"
// hides ?token=, ?Access-Token= and ?github_token=. A name must be
// non-empty and hold no '=', '&', '#', '?' or space; nil or an empty list
// hides none.
func SetSecretParams(names []string) error {
	for _, n := range names {
		if n == "" || strings.ContainsAny(n, "=&#?; \t\r\n") {
			return fmt.Errorf("redact: %q is not a query parameter name", n)
		}
	}
	secretParams.Store(normalizeAll(names))
	return nil
}

func normalize(name string) string { return strings.ReplaceAll(strings.ToLower(name), "-", "_") }

func normalizeAll(names []string) *[]string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = normalize(n)
	}
	return &out
}

// secretParam reports whether a query parameter's (still encoded) name
// looks secret.
func secretParam(encoded string) bool {
	name := normalize(decodeLenient(encoded))
	for _, s := range *secretParams.Load() {
		if name == s || strings.HasSuffix(name, "_"+s) {
			return true
		}
	}
	return false
}

// URL returns a URL fit to print. A database URL (postgres:// or
// postgresql://, in any case) or keyword/value string is shown by the
// database rules (database.go), and so is anything else holding a '=' or
// "://" that is no URL (for free text, see Text). Of any other URL the user information is
// masked — https://user:xxxxx@host/…, and a user name given alone, which
// is often a token, https://xxxxx@host/… — and so are the values of its
// secret-looking query (and fragment) parameters, ?api_key=xxxxx. When the
// URL's '@' could be read more than one way (several before the path, or
// one after the path begins in a URL that does not parse as an ordinary
// one), everything between "://" and the last '@' is masked; an '@' in the
// path or query of a URL with plain user information is not one of those.
// Anything else comes back unchanged: URL(u) != u says u holds a secret.
func URL(raw string) string {
	scheme, rest, isURL := splitScheme(raw)
	switch {
	case !isURL && (strings.Contains(raw, "=") || strings.Contains(raw, "://")):
		return connString(raw)
	case !isURL:
		return raw
	case isDatabaseScheme(scheme):
		return databaseURL(scheme, rest, raw)
	}
	rest = maskParams(rest) // first: an '@' in a secret value is no separator
	if !strings.Contains(rest, "@") {
		return scheme + "://" + rest
	}
	maskAll := scheme + "://" + Mask + "@" + rest[strings.LastIndex(rest, "@")+1:]
	userinfo, after, _ := strings.Cut(rest, "@")
	host := after
	if i := strings.IndexAny(after, "/?#"); i >= 0 {
		host = after[:i]
	}
	switch {
	case strings.Contains(host, "@"), strings.Contains(after, "@") && strings.ContainsAny(userinfo, "/?#"):
		// Another '@' before the path, or one after a user information
		// that is not plainly one.
		return maskAll
	case strings.ContainsAny(userinfo, "/?#"):
		// The '@' is in the path, query or fragment: no user information
		// if the URL parses as one with a host and none (a profile URL such
		// as https://example.social/@name); otherwise a password with a '/'.
		if u, err := url.Parse(raw); err == nil && u.User == nil && u.Host != "" {
			return scheme + "://" + rest
		}
		return maskAll
	}
	if user, _, hasPassword := strings.Cut(userinfo, ":"); hasPassword {
		return scheme + "://" + user + ":" + Mask + "@" + after
	}
	return scheme + "://" + Mask + "@" + after
}

// maskParams masks the values of the secret-looking parameters of the
// query and of the fragment of s (a URL without its scheme and user
// information). Parameters are separated by '&' or ';'.
func maskParams(s string) string {
	q := strings.IndexByte(s, '?')
	f := strings.IndexByte(s, '#')
	switch {
	case q < 0 && f < 0:
		return s
	case q < 0 || (f >= 0 && f < q):
		return s[:f+1] + maskPairs(s[f+1:])
	case f < 0:
		return s[:q+1] + maskPairs(s[q+1:])
	default:
		return s[:q+1] + maskPairs(s[q+1:f]) + "#" + maskPairs(s[f+1:])
	}
}

// maskPairs masks the values of the secret-looking pairs of a query.
func maskPairs(q string) string {
	var b strings.Builder
	for q != "" {
		end := strings.IndexAny(q, "&;")
		pair, sep := q, ""
		if end >= 0 {
			pair, sep = q[:end], q[end:end+1]
			q = q[end+1:]
		} else {
			q = ""
		}
		if key, _, hasValue := strings.Cut(pair, "="); hasValue && secretParam(key) {
			pair = key + "=" + Mask
		}
		b.WriteString(pair + sep)
	}
	return b.String()
}
