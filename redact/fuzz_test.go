package redact_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/fleetpace/fleetpace/redact"
)

// secretLetters spell the fuzzed passwords: letters no message of this
// package uses together, so a run of three of them in any output is a part
// of the password.
const secretLetters = "QXZJ"

// separators are kept in the fuzzed passwords as they are: they are what
// can split a URL where it should not be split.
const separators = "@/:?#&=' \\%,;\t\n\"`<>[]"

// spell maps s to a password of secretLetters and separators.
func spell(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !strings.ContainsRune(separators, rune(c)) {
			b[i] = secretLetters[int(c)%len(secretLetters)]
		}
	}
	return string(b)
}

// pieces are the runs of three or more password letters in secret.
func pieces(secret string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(secret, func(r rune) bool { return !strings.ContainsRune(secretLetters, r) }) {
		if len(f) >= 3 {
			out = append(out, f)
		}
	}
	return out
}

// FuzzRedact: whatever a database URL or keyword/value string looks like —
// a password with '@', '/', spaces, quotes or escapes in it, upper-case
// keys, %-escaped keys, a wrong scheme — no part of its password appears in
// what this package prints of it: URL, DescribeDatabase, Text of a message
// that quotes it, and CheckDatabaseURL's error. Seeds:
// testdata/fuzz/FuzzRedact.
func FuzzRedact(f *testing.F) {
	f.Add(uint8(0), "alice", "s3cret@pw", "127.0.0.1:5432/fp")
	f.Fuzz(func(t *testing.T, form uint8, user, password, rest string) {
		secret := spell(password)
		ps := pieces(secret)
		if len(ps) == 0 {
			return
		}
		quoted := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(secret)
		forms := []string{
			"postgres://" + user + ":" + secret + "@" + rest,
			"postgresql://" + user + ":" + secret + "@" + rest,
			"POSTGRES://" + user + ":" + secret + "@" + rest,
			"host=h user=" + user + " password=" + secret + " " + rest,
			"host=h user=" + user + " PASSWORD='" + quoted + "' " + rest,
			"host=h password = '" + quoted + "' " + rest,
			"postgres://" + user + "@h/db?sslmode=disable&pass%77ord=" + url.QueryEscape(secret) + "&" + rest,
			"postgres://" + user + "@h/db?password=" + secret + "&" + rest,
			"mysql://" + user + ":" + secret + "@" + rest,
		}
		raw := forms[int(form)%len(forms)]
		if int(form)%len(forms) == 3 && strings.ContainsAny(secret, " \t\n\\'=") {
			// An unquoted value ends at a space: the rest is the next
			// keyword, and may be shown as one once the string is read.
			return
		}
		others := strings.Replace(raw, secret, "", 1)
		outputs := map[string]string{
			"DescribeDatabase": redact.DescribeDatabase(raw),
			"Text":             redact.Text("connect to " + raw + " failed: no"),
		}
		if int(form)%len(forms) != len(forms)-1 || !strings.ContainsAny(user+secret, "/?#") {
			// Not as a database URL, a URL of another scheme is read by
			// the rules of the web (FuzzURL): a '/', '?' or '#' in its
			// user information ends it.
			outputs["URL"] = redact.URL(raw)
		}
		if err := redact.CheckDatabaseURL(raw); err != nil {
			outputs["CheckDatabaseURL"] = err.Error()
		}
		for name, out := range outputs {
			for _, p := range ps {
				if strings.Contains(out, p) && !strings.Contains(others, p) {
					t.Fatalf("%s(%q) = %q shows %q, a part of the password %q", name, raw, out, p, secret)
				}
			}
		}
	})
}
