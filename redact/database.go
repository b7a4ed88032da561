package redact

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Database passwords are never printed. The rule for a database URL that
// cannot be read one way only — it does not parse, or its '@' could end
// more than one user information — is stricter: nothing after its user
// name is printed, since any part of it may be a part of the password. A
// URL is read as pgx reads it (libpq's rules: the user information ends at
// the first '@' before the first '/'), and CheckDatabaseURL refuses the
// URLs that could put a part of a password into a host name, a port or a
// database name, which messages do print.

// ErrInvalidDatabaseURL is wrapped by every error of CheckDatabaseURL.
var ErrInvalidDatabaseURL = errors.New("invalid database URL")

// urlError is an invalid database URL: what of it may be shown, and why it
// is refused. Its message never contains pgx's, which may quote parts of
// the URL; the chain keeps pgx's error for errors.As.
type urlError struct {
	raw    string // the URL, shown through database only
	reason string
	err    error // pgx's, or nil
}

// Error names the URL last: Text, which a command line applies to every
// message, drops whatever follows a database URL in free text.
func (e *urlError) Error() string {
	return fmt.Sprintf("%v: %s: %s", ErrInvalidDatabaseURL, e.reason, database(e.raw))
}

func (e *urlError) Unwrap() []error {
	if e.err == nil {
		return []error{ErrInvalidDatabaseURL}
	}
	return []error{ErrInvalidDatabaseURL, e.err}
}

func invalidURL(raw, reason string, err error) error {
	return &urlError{raw: raw, reason: reason, err: err}
}

// splitScheme splits a URL into its scheme and the rest; isURL is false for
// a keyword/value string (nothing before "://" that could be a scheme).
func splitScheme(raw string) (scheme, rest string, isURL bool) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || !schemeRE.MatchString(scheme) {
		return "", "", false
	}
	return scheme, rest, true
}

var schemeRE = regexp.MustCompile(`^\s*[A-Za-z][A-Za-z0-9+.-]*$`)

// isDatabaseScheme reports a scheme read by the database rules: postgres
// and postgresql in any case (pgx reads only the lower-case ones as URLs,
// so the others are refused, and shown up to the user name).
func isDatabaseScheme(scheme string) bool {
	s := strings.ToLower(strings.TrimSpace(scheme))
	return s == "postgres" || s == "postgresql"
}

// CheckDatabaseURL refuses, wrapping ErrInvalidDatabaseURL, a database URL
// or keyword/value string that cannot be read one way only:
//
//   - a scheme other than postgres:// or postgresql:// (pgx would read it
//     as a keyword/value string);
//   - a second '@' (an '@' in a password must be written %40: pgx ends the
//     user information at the first '@', so the rest of the password
//     became the host name), or an '@' after a '/' (a '/' in a password
//     must be written %2F: the user information then ends at the '/', and
//     the rest of the password became the port or the database name);
//   - one pgx cannot parse (the reason in pgx's fixed words, pgx's error in
//     the chain);
//   - a setting pgx would pass to the server as a run-time parameter whose
//     name says it is a password (PASSWORD=…: keys are lower case), which
//     the user meant as one; a user name, database or host holding an '='
//     (an empty value reads the next keyword as its own: user= password=x
//     is the user "password=x"), which messages print.
//
// dbconn.PoolConfig calls it first; what its errors and DescribeDatabase
// print of a URL it refuses is its user name at most.
func CheckDatabaseURL(raw string) error {
	if err := checkAmbiguity(raw); err != nil {
		return err
	}
	c, err := pgxpool.ParseConfig(raw)
	if err != nil {
		return invalidURL(raw, parseReason(err), err)
	}
	return checkParsed(raw, c.ConnConfig.Config)
}

// checkAmbiguity is CheckDatabaseURL's check before parsing: the scheme and
// the '@'s of a URL (a keyword/value string is left to pgx's parser).
func checkAmbiguity(raw string) error {
	scheme, rest, isURL := splitScheme(raw)
	if !isURL {
		return nil
	}
	at, slash := strings.Index(rest, "@"), strings.Index(rest, "/")
	switch n := strings.Count(rest, "@"); {
	case scheme != "postgres" && scheme != "postgresql":
		return invalidURL(raw, "the scheme must be postgres:// or postgresql:// (in lower case)", nil)
	case n > 1:
		return invalidURL(raw, fmt.Sprintf("'@' appears %d times, so where the password ends is ambiguous: write an '@' of a user name or password as %%40", n), nil)
	case at >= 0 && slash >= 0 && slash < at:
		return invalidURL(raw, "its '@' comes after a '/', so where the password ends is ambiguous: write a '/' of a password as %2F (an '@' elsewhere as %40)", nil)
	}
	return nil
}

// pgxReasons are phrases of pgx's parse errors that may be repeated: fixed
// text, never a part of the URL.
var pgxReasons = []string{
	"invalid port", "unterminated quoted string", "invalid percent-encoded token", "forbidden value %00",
	"unexpected spaces found", "missing key/value separator", "extra key/value separator", `missing "="`,
	"invalid keyword/value", "IPv6 host address", "forbidden NUL byte", "port numbers to", "unknown target_session_attrs value",
	"unknown channel_binding value", "sslmode is invalid", "invalid min_protocol_version", "invalid max_protocol_version",
	"invalid require_auth", "failed to configure TLS", "connect_timeout", "pool_", "statement_cache_capacity",
	"description_cache_capacity", "default_query_exec_mode",
}

// parseReason says why pgx could not parse a URL in its own fixed words.
func parseReason(err error) string {
	msg := err.Error()
	for _, r := range pgxReasons {
		if strings.Contains(msg, r) {
			return "cannot be parsed (" + r + ")"
		}
	}
	return "cannot be parsed as a PostgreSQL URL or keyword/value string"
}

// checkParsed is CheckDatabaseURL's check of what pgx read.
func checkParsed(raw string, c pgconn.Config) error {
	printed := []string{c.User, c.Database, c.Host}
	for _, fb := range c.Fallbacks {
		printed = append(printed, fb.Host)
	}
	for _, v := range printed {
		if strings.Contains(v, "=") {
			return invalidURL(raw, "its user name, database or host holds an '=': an empty value must be written '' (else it takes the next keyword as its value)", nil)
		}
	}
	for k := range c.RuntimeParams {
		if strings.Contains(strings.ToLower(k), "pass") {
			return invalidURL(raw, fmt.Sprintf("%q is not a connection setting (setting names are lower case: password, sslpassword, passfile)", clipKey(k)), nil)
		}
	}
	return nil
}

func clipKey(k string) string {
	if len(k) > 40 {
		return k[:40] + "…"
	}
	return k
}

// readable returns how pgx reads raw if CheckDatabaseURL accepts it.
func readable(raw string) (*pgconn.Config, bool) {
	if checkAmbiguity(raw) != nil {
		return nil, false
	}
	c, err := pgconn.ParseConfig(raw)
	if err != nil || checkParsed(raw, *c) != nil {
		return nil, false
	}
	return c, true
}

// database is what may be printed of a database URL or keyword/value
// string: URL's database rules, and of a URL of another scheme (which
// CheckDatabaseURL refuses) its user name at most.
func database(raw string) string {
	scheme, rest, isURL := splitScheme(raw)
	switch {
	case !isURL:
		return connString(raw)
	case !isDatabaseScheme(scheme):
		return scheme + "://" + userRun(rest) + "…"
	}
	return databaseURL(scheme, rest, raw)
}

// connString is URL for a keyword/value string: the values of the keys
// whose name contains "pass" masked; of one that cannot be read one way
// only, its known keys.
func connString(raw string) string {
	if _, ok := readable(raw); ok {
		return redactKeywords(raw)
	}
	return "keyword/value string (keys " + strings.Join(keywords(raw), ", ") + ")"
}

// databaseURL is URL for a postgres:// URL: one that can be read one way
// only has its passwords masked (the user information's, and the values of
// every query parameter whose name contains "pass", in any case and
// spelling, with the rest of the query); of any other, nothing after the
// user name is shown (postgres://alice…).
func databaseURL(scheme, rest, raw string) string {
	if _, ok := readable(raw); !ok {
		return scheme + "://" + userRun(rest) + "…"
	}
	var b strings.Builder
	b.WriteString(scheme + "://")
	if userinfo, after, found := strings.Cut(rest, "@"); found {
		user, _, hasPassword := strings.Cut(userinfo, ":")
		b.WriteString(user)
		if hasPassword {
			b.WriteString(":" + Mask)
		}
		b.WriteByte('@')
		rest = after
	}
	base, query, hasQuery := strings.Cut(rest, "?")
	b.WriteString(base)
	if hasQuery {
		b.WriteByte('?')
		b.WriteString(redactQuery(query))
	}
	return b.String()
}

// redactQuery masks the value of the first parameter whose decoded name
// contains "pass", and everything after it.
func redactQuery(q string) string {
	pairs := strings.Split(q, "&")
	for i, p := range pairs {
		key, _, _ := strings.Cut(p, "=")
		if strings.Contains(strings.ToLower(decodeLenient(key)), "pass") {
			return strings.Join(append(pairs[:i:i], key+"="+Mask), "&")
		}
	}
	return q
}

// decodeLenient decodes %XX escapes and leaves anything else as it is.
func decodeLenient(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// userRun is the user name at the start of a URL's rest, as far as it is
// made of characters that cannot hide a separator.
func userRun(rest string) string {
	end := strings.IndexFunc(rest, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._~-", r))
	})
	if end < 0 {
		return rest
	}
	return rest[:end]
}

// passKey matches the start of a keyword whose name contains "pass" (in
// any case, %-escaped or not) up to its value.
var passKey = regexp.MustCompile(`(?i)(?:^|[^\w%])[\w%]*pass[\w%]*\s*=\s*`)

// nextKey matches the start of the next keyword of a keyword/value string
// (after one character that is not a backslash: an escaped space is a
// part of the value).
var nextKey = regexp.MustCompile(`[^\\]\s+[A-Za-z_][\w%]*=`)

// redactKeywords masks the values of the keywords whose name contains
// "pass" in a keyword/value string, or in text that may hold one.
func redactKeywords(s string) string {
	var b strings.Builder
	for {
		loc := passKey.FindStringIndex(s)
		if loc == nil {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:loc[1]] + Mask)
		s = s[loc[1]:]
		s = s[valueEnd(s):]
	}
}

// valueEnd is where the value at the start of v ends: a quoted one after
// its closing quote, if a space or the end follows; any other (unquoted,
// unterminated, or with more after its quote) where the next keyword
// begins, or at the end of v. Where a value cannot be told from what
// follows it, all of it is taken: a password may hold spaces.
func valueEnd(v string) int {
	if strings.HasPrefix(v, "'") {
		for i := 1; i < len(v); i++ {
			if v[i] == '\\' {
				i++
				continue
			}
			if v[i] == '\'' {
				if i+1 == len(v) || strings.ContainsRune(" \t\r\n\v\f", rune(v[i+1])) {
					return i + 1
				}
				break
			}
		}
	}
	if loc := nextKey.FindStringIndex(v); loc != nil {
		return loc[0] + 1
	}
	return len(v)
}

// knownKeys are the keywords URL names in a keyword/value string it cannot
// read: libpq's and pgx's. Any other word may be a part of a password.
var knownKeys = []string{"host", "hostaddr", "port", "dbname", "database", "user", "password", "passfile",
	"connect_timeout", "sslmode", "sslkey", "sslcert", "sslrootcert", "sslpassword", "sslnegotiation", "sslsni",
	"application_name", "options", "target_session_attrs", "service", "servicefile", "channel_binding",
	"require_auth", "min_protocol_version", "max_protocol_version", "search_path", "timezone"}

var keywordRE = regexp.MustCompile(`(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)\s*=`)

// keywords lists the known keywords of a keyword/value string, and "…" for
// anything else that looks like one.
func keywords(s string) []string {
	var out []string
	for _, m := range keywordRE.FindAllStringSubmatch(s, -1) {
		k := m[1]
		if !slices.Contains(knownKeys, k) {
			k = "…"
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return []string{"none"}
	}
	return out
}

// DescribeDatabase names a database for humans, as it will be dialled:
// "alice@db.example:5432/fleetpace" (every host of a multi-host URL), read
// by pgx as a connection reads it. A URL that cannot be read one way only
// is described by its user name at most.
func DescribeDatabase(raw string) string {
	c, ok := readable(raw)
	if !ok {
		return database(raw)
	}
	hosts := []string{net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port)))}
	for _, fb := range c.Fallbacks {
		if h := net.JoinHostPort(fb.Host, strconv.Itoa(int(fb.Port))); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return c.User + "@" + strings.Join(hosts, ",") + "/" + c.Database
}
