package sources_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/sources"
)

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
