package redact_test

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fleetpace/fleetpace/redact"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://user:secret@example.com/feed": "https://user:xxxxx@example.com/feed",
		"https://token@example.com/a?b=c@d":    "https://xxxxx@example.com/a?b=c@d",
		"http://u:p@ss@example.com:8080/":      "http://xxxxx@example.com:8080/",
		"https://example.com/a@b":              "https://example.com/a@b",
		"https://u:pa/ss@h.example/":           "https://xxxxx@h.example/",
		"https://u:p/w@h.example/x@y":          "https://xxxxx@y",
		"https://example.social/@name":         "https://example.social/@name",
		"https://example.com/feed.xml":         "https://example.com/feed.xml",
		"not a url with @ in it":               "not a url with @ in it",
		// Secret-looking query and fragment parameters.
		"https://h.example/f?api_key=s3cret&page=2":            "https://h.example/f?api_key=xxxxx&page=2",
		"https://h.example/f?page=2;Access-Token=s3cret#top":   "https://h.example/f?page=2;Access-Token=xxxxx#top",
		"https://h.example/f?github_token=s3cret&keyboard=qw":  "https://h.example/f?github_token=xxxxx&keyboard=qw",
		"https://h.example/f?%61pi_key=s3cret":                 "https://h.example/f?%61pi_key=xxxxx",
		"https://h.example/cb#access_token=s3cret&state=x":     "https://h.example/cb#access_token=xxxxx&state=x",
		"https://u:pw@h.example/f?sig=s3cret&X-Amz-Signature=": "https://u:xxxxx@h.example/f?sig=xxxxx&X-Amz-Signature=xxxxx",
		"https://h.example/f?token":                            "https://h.example/f?token",
		"https://example.social/@name?token=s3cret":            "https://example.social/@name?token=xxxxx",
		// Database URLs and keyword/value strings: the database rules.
		"postgres://u:hunter2@h/db?sslmode=disable":              "postgres://u:xxxxx@h/db?sslmode=disable",
		"postgres://u@h/db?sslmode=disable&password=hunter2&x=1": "postgres://u@h/db?sslmode=disable&password=xxxxx",
		"POSTGRES://u:hunter2@h/db":                              "POSTGRES://u…",
		"host=db user=u password=hunter2 dbname=x":               "host=db user=u password=xxxxx dbname=x",
	} {
		if got := redact.URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}

// The secret-looking names can be changed for the process.
func TestSetSecretParams(t *testing.T) {
	defer func() {
		if err := redact.SetSecretParams(redact.DefaultSecretParams); err != nil {
			t.Fatal(err)
		}
	}()
	if err := redact.SetSecretParams([]string{"X-Feed-Secret"}); err != nil {
		t.Fatal(err)
	}
	if got := redact.URL("https://h.example/?x_feed_secret=1&api_key=2"); got != "https://h.example/?x_feed_secret=xxxxx&api_key=2" {
		t.Errorf("URL with a custom list = %q", got)
	}
	if got := redact.SecretParams(); !slices.Equal(got, []string{"x_feed_secret"}) {
		t.Errorf("SecretParams() = %q", got)
	}
	for _, bad := range []string{"", "a=b", "a b", "a&b"} {
		if err := redact.SetSecretParams([]string{bad}); err == nil {
			t.Errorf("SetSecretParams(%q) accepted", bad)
		}
	}
	if got := redact.SecretParams(); !slices.Equal(got, []string{"x_feed_secret"}) {
		t.Errorf("a refused list changed the names: %q", got)
	}
}

func TestDatabase(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, secret string }{
		{"postgres://user:hunter2@db.example:5432/x", "hunter2"},
		{"postgresql://user:p%40ss@db/x?sslmode=require", "p%40ss"},
		{"host=db user=u password=hunter2 dbname=x", "hunter2"},
		{"host=db password='hun ter2' dbname=x", "hun ter2"},
		{`failed to connect to "postgres://a:b3cret@h/db"`, "b3cret"},
		{"host=db PASSWORD=hunter2", "hunter2"},
		{"host=db Password = 'hun\\' ter2'", "ter2"},
		{"host=db password=hun\\ ter2 user=u", "ter2"},
		{"host=db password='unterminated secret", "secret"},
		{"postgres://u@h/db?pass%77ord=hunter2&x=1", "hunter2"},
		{"POSTGRES://u:hunter2@h/db", "hunter2"},
		{"mysql://u:hunter2@h/db", "hunter2"},
		{"postgres://postgres:Wr@ngPwXYZ@127.0.0.1:55433/fp", "ngPwXYZ"},
		{"error: postgres://u:pa ssXYZ@h/db refused", "ssXYZ"},
		{"postgres://u:hunter2", "hunter2"},
		{"hunter2", "hunter2"},
	}
	for _, tt := range tests {
		outputs := map[string]string{"DescribeDatabase": redact.DescribeDatabase(tt.in)}
		if tt.in != tt.secret { // a bare word is no URL: URL and Text show it
			outputs["URL"], outputs["Text"] = redact.URL(tt.in), redact.Text(tt.in)
		}
		if err := redact.CheckDatabaseURL(tt.in); err != nil {
			outputs["CheckDatabaseURL"] = err.Error()
		}
		for name, got := range outputs {
			if strings.Contains(got, tt.secret) {
				t.Errorf("%s(%q) = %q still holds the password", name, tt.in, got)
			}
		}
	}
	if got := redact.DescribeDatabase("postgres://user:hunter2@db.example:5432/x"); got != "user@db.example:5432/x" {
		t.Errorf("DescribeDatabase = %q", got)
	}
	err := redact.CheckDatabaseURL("postgres://u:hunter2@[::1:5432/db")
	var parseErr *pgconn.ParseConfigError
	if !errors.Is(err, redact.ErrInvalidDatabaseURL) || !errors.As(err, &parseErr) || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("invalid URL error %v: want ErrInvalidDatabaseURL with pgx's error in its chain, without the password", err)
	}
}

// A URL whose '@' or '/' could put a part of the password into the host
// name, the port or the database name — which messages print — is refused
// before pgx reads it; so is a key that would send a password to the server
// as a run-time parameter. DescribeDatabase names what is dialled.
func TestAmbiguousDatabaseURLs(t *testing.T) {
	t.Parallel()
	tests := []struct{ url, reason string }{
		{"postgres://postgres:Wr@ngPwXYZ@127.0.0.1:55433/fp", "'@' appears 2 times"},
		{"postgres://u:12/XYZ@127.0.0.1/fp", "after a '/'"},
		{"POSTGRES://u:XYZ@127.0.0.1/fp", "scheme"},
		{"postgresql+psycopg://u:XYZ@127.0.0.1/fp", "scheme"},
		{"host=127.0.0.1 user=u PASSWORD=XYZ", `"PASSWORD" is not a connection setting`},
		{"postgres://u@127.0.0.1/fp?Password=XYZ", `"Password" is not a connection setting`},
		{"postgres://u:XYZ@127.0.0.1:port/fp", "invalid port"},
		{"host=127.0.0.1 password='XYZ", "unterminated quoted string"},
		{"host=127.0.0.1 user= password=XYZ", "empty value"},
		{"host= password=XYZ", "empty value"},
		{"postgres://u:XYZ@127.0.0.1/fp?pool_max_conns=many", "pool_"},
	}
	for _, tt := range tests {
		err := redact.CheckDatabaseURL(tt.url)
		if !errors.Is(err, redact.ErrInvalidDatabaseURL) || !strings.Contains(err.Error(), tt.reason) || strings.Contains(err.Error(), "XYZ") {
			t.Errorf("CheckDatabaseURL(%q) = %v; want ErrInvalidDatabaseURL saying %q without the password", tt.url, err, tt.reason)
		}
	}
	for url, want := range map[string]string{
		"postgres://alice:p%40ss@db1.example:6432,db2.example/fp?sslmode=disable": "alice@db1.example:6432,db2.example:5432/fp",
		"host=/run/postgresql port=5433 user=bob dbname=x password=pw":            "bob@/run/postgresql:5433/x",
		"postgres://alice:pw@[::1]:5433/fp":                                       "alice@[::1]:5433/fp",
	} {
		if got := redact.DescribeDatabase(url); got != want {
			t.Errorf("DescribeDatabase(%q) = %q, want %q", url, got, want)
		}
		if err := redact.CheckDatabaseURL(url); err != nil {
			t.Errorf("CheckDatabaseURL(%q): %v", url, err)
		}
	}
}

func TestText(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`redirect to "https://h.example/x?token=s3cret" refused`: `redirect to "https://h.example/x?token=xxxxx" refused`,
		"see https://u:s3cret@h.example/ now":                    "see https://xxxxx@h.example/ now",
		"plain words":                                            "plain words",
	} {
		if got := redact.Text(in); got != want {
			t.Errorf("Text(%q) = %q, want %q", in, got, want)
		}
	}
}

var hasScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

// FuzzURL: whatever a URL looks like, URL and Text never show the password
// of its user information, nor the value of a secret-looking query
// parameter. A '/', '?' or '#' in a password makes the URL mean another
// host, and a '&', ';' or '#' ends a parameter's value (documented); a
// secret that is a part of the rest of the URL cannot be told from it.
func FuzzURL(f *testing.F) {
	f.Add("https://a.example/feed.xml", "hunter2", uint8(0))
	f.Add("https://a.example/feed.xml?x=1", "hunter2", uint8(3))
	f.Fuzz(func(t *testing.T, raw, secret string, name uint8) {
		if len(secret) < 3 {
			return
		}
		var forms []string
		if !strings.ContainsAny(secret, "/?#") {
			forms = append(forms, "https://alice:"+secret+"@a.example/feed?x=1", "https://alice:"+secret+"@"+raw)
			if !strings.Contains(secret, ":") { // else a user name and a password
				forms = append(forms, "http://"+secret+"@a.example/")
			}
		}
		if !strings.ContainsAny(secret, "&;#") {
			names := []string{"api_key", "Access-Token", "github_token", "%61pi_key", "PASSWORD", "sig"}
			n := names[int(name)%len(names)]
			forms = append(forms, "https://a.example/feed?x=1&"+n+"="+secret+"&y=2")
			if !strings.Contains(raw, "#") {
				sep := "?"
				if strings.Contains(raw, "?") {
					sep = "&"
				}
				forms = append(forms, raw+sep+n+"="+secret)
			}
		}
		for _, u := range forms {
			rest := strings.Replace(u, secret, "", 1)
			if strings.Contains(rest+" xxxxx", secret) || !hasScheme.MatchString(u) {
				continue
			}
			if red := redact.URL(u); strings.Contains(red, secret) {
				t.Fatalf("URL(%q) = %q shows the secret", u, red)
			}
			if strings.ContainsAny(u, " \t\r\n`\"'<>") || strings.Contains(strings.ToLower(u), "postgres") {
				continue // where a URL ends in free text is another matter
			}
			msg := "GET " + u + ": refused"
			if strings.Contains(strings.Replace(msg, secret, "", 1)+" xxxxx", secret) {
				continue
			}
			if red := redact.Text(msg); strings.Contains(red, secret) {
				t.Fatalf("Text(%q) = %q shows the secret", u, red)
			}
		}
	})
}
