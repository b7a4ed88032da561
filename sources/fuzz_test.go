package sources_test

import (
	"errors"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/sources"
)

// FuzzParse: whatever the file, Parse does not panic; it returns valid
// rows with increasing line numbers, or an ImportError whose lines exist in
// the input; and it says the same thing twice. Seeds:
// testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add("platform,url,interval\np,https://a.example/1,30m\n", uint8(0))
	f.Add("{\"platform\":\"p\",\"url\":\"https://a.example/1\"}\n", uint8(2))
	f.Fuzz(func(t *testing.T, in string, format uint8) {
		opts := sources.ImportOptions{Format: []sources.Format{sources.FormatAuto, sources.FormatCSV, sources.FormatJSONL}[format%3]}
		rows, err := sources.Parse(strings.NewReader(in), opts)
		lines := strings.Count(in, "\n") + 1
		var ie *sources.ImportError
		switch {
		case err == nil:
			last := 0
			for _, r := range rows {
				if r.Line <= last || r.Line > lines {
					t.Fatalf("row on line %d after line %d (%d lines)", r.Line, last, lines)
				}
				last = r.Line
				if verr := r.NewSource.Validate(); verr != nil {
					t.Fatalf("line %d: an invalid row was returned: %v", r.Line, verr)
				}
			}
		case errors.As(err, &ie):
			if len(ie.Lines) == 0 || !errors.Is(err, sources.ErrInvalid) {
				t.Fatalf("ImportError without lines: %v", err)
			}
			for _, l := range ie.Lines {
				if l.Line < 1 || l.Line > lines {
					t.Fatalf("bad line %d of a %d-line input", l.Line, lines)
				}
			}
			if !utf8.ValidString(err.Error()) && utf8.ValidString(in) {
				t.Fatalf("message is not UTF-8: %q", err.Error())
			}
		default:
			t.Fatalf("Parse of an in-memory input failed without an ImportError: %v", err)
		}
		rows2, err2 := sources.Parse(strings.NewReader(in), opts)
		if !reflect.DeepEqual(rows, rows2) || (err == nil) != (err2 == nil) || (err != nil && err.Error() != err2.Error()) {
			t.Fatalf("two parses differ: %v %v / %v %v", rows, err, rows2, err2)
		}
	})
}

// FuzzValidateURL: ValidateURL accepts only what the fetcher can use, and
// neither its error nor redact.URL ever shows the password of a URL with
// user information. Seeds: testdata/fuzz/FuzzValidateURL.
func FuzzValidateURL(f *testing.F) {
	f.Add("https://a.example/feed.xml", "hunter2")
	f.Fuzz(func(t *testing.T, raw, secret string) {
		if err := sources.ValidateURL(raw); err == nil {
			u, perr := url.Parse(raw)
			switch {
			case len(raw) > sources.MaxURLBytes, !utf8.ValidString(raw):
				t.Fatalf("accepted %d bytes (UTF-8 %v)", len(raw), utf8.ValidString(raw))
			case perr != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "":
				t.Fatalf("accepted %q: %v", raw, perr)
			case strings.ContainsAny(raw, " \t\r\n\x00\x7f"):
				t.Fatalf("accepted whitespace or a control character: %q", raw)
			}
		} else {
			var fe *sources.FieldError
			if !errors.As(err, &fe) || fe.Field != "url" || !errors.Is(err, sources.ErrInvalid) {
				t.Fatalf("error %v is not a FieldError on url", err)
			}
		}

		// The password of a URL with user information. A '/', '?' or '#' in
		// it makes the URL mean another host (documented); a secret that is
		// a part of the rest of the URL cannot be told from it.
		if len(secret) < 3 || strings.ContainsAny(secret, "/?#") {
			return
		}
		creds := []string{"https://alice:" + secret + "@a.example/feed?x=1", "https://alice:" + secret + "@" + raw}
		if !strings.Contains(secret, ":") { // else a user name and a password
			creds = append(creds, "http://"+secret+"@a.example/")
		}
		for _, withCreds := range creds {
			rest := strings.Replace(withCreds, secret, "", 1)
			if strings.Contains(rest+" xxxxx", secret) {
				continue
			}
			if red := redact.URL(withCreds); strings.Contains(red, secret) {
				t.Fatalf("redact.URL(%q) = %q shows the secret", withCreds, red)
			}
			var fe *sources.FieldError
			if err := sources.ValidateURL(withCreds); errors.As(err, &fe) && strings.Contains(fe.Value, secret) {
				t.Fatalf("ValidateURL(%q) = %v shows the secret", withCreds, err)
			}
		}
	})
}
