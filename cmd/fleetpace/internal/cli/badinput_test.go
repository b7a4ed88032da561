package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/testdb"
)

// badCase is one bad input to the real binary: it must exit 2, name what
// is wrong, print no secret and write nothing.
type badCase struct {
	name   string
	args   []string // after -q --database-url URL, unless raw
	raw    bool     // args are the whole command line
	env    []string // added to the environment
	stdin  string
	want   []string // each in stderr
	secret string   // nowhere in stdout or stderr
}

// snapshot is what a test of refused commands compares before and after
// them: row counts and max ids of fleetpace's tables and river_job, and the
// contents of every fleetpace table (the fetch history too; the workers'
// heartbeats only counted) and of river_job's id, state and schedule (a
// woken job is a write).
func snapshot(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	err := pool.QueryRow(context.Background(), `SELECT concat_ws(' | ',
	    (SELECT count(*) || ' ' || md5(coalesce(string_agg(p::text, ';' ORDER BY name), '')) FROM fleetpace_platform p),
	    (SELECT count(*) || ' ' || md5(coalesce(string_agg(p::text, ';' ORDER BY platform), '')) FROM fleetpace_pace p),
	    (SELECT count(*) || ' ' || coalesce(max(id), 0) || ' ' || md5(coalesce(string_agg(s::text, ';' ORDER BY id), '')) FROM fleetpace_source s),
	    (SELECT count(*) || ' ' || md5(coalesce(string_agg(c::text, ';' ORDER BY platform), '')) FROM fleetpace_cooldown c),
	    (SELECT count(*) || ' ' || md5(coalesce(string_agg(k::text, ';' ORDER BY platform, key), '')) FROM fleetpace_key_limit k),
	    (SELECT count(*) || ' ' || md5(coalesce(string_agg(c::text, ';' ORDER BY c::text), '')) FROM fleetpace_check c),
	    (SELECT count(*) FROM fleetpace_worker),
	    (SELECT count(*) || ' ' || coalesce(max(id), 0) || ' ' ||
	            md5(coalesce(string_agg(id || ' ' || state || ' ' || scheduled_at, ';' ORDER BY id), '')) FROM river_job))`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBadInput is the bad-input battery: every command and every import
// format, given what a careless user or an attacker would give it. Each
// case exits 2, names the field, line or value, prints no password or URL
// secret, does not panic, and writes nothing (row counts, max ids and
// contents of fleetpace's tables and river_job are the same after it).
func TestBadInput(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	pool := testdb.PoolOf(t, url)
	for _, setup := range [][]string{
		{"platforms", "set", "ok", "--rate", "5"},
		{"sources", "add", "--platform", "ok", "--url", "https://ok.example/1"},
		{"sources", "add", "--platform", "ok", "--url", "https://alice:s3cr3tLIST@creds.example/feed"},
	} {
		if r := run(t, "", append([]string{"-q", "--database-url", url}, setup...)...); r.code != 0 {
			t.Fatalf("setup %v: %s", setup, r)
		}
	}

	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	aFile := file("a-file", "")
	hugeURL := "https://x.example/" + strings.Repeat("a", 100_000)
	// The 10,000-line import with three bad lines deep inside.
	var big strings.Builder
	big.WriteString("platform,url,interval\n")
	for i := 2; i <= 10_000; i++ {
		switch i {
		case 5000:
			big.WriteString("ok,https://big.example/5000,1ns\n")
		case 7000:
			big.WriteString("ok," + hugeURL + "\n")
		case 9000:
			big.WriteString("ok,https://big.example/\xff\xfe\n")
		default:
			fmt.Fprintf(&big, "ok,https://big.example/%d,1h\n", i)
		}
	}
	jsonLine := func(u string) string { return `{"platform":"ok","url":"` + u + `"}` }
	imports := []badCase{
		{name: "csv unterminated quote", args: []string{file("quote.csv", "platform,url\nok,https://a.example/1\nok,\"https://a.example/2\nok,https://a.example/3\n")}, want: []string{"line 3", "never closed"}},
		{name: "csv extra unknown column", args: []string{file("extra.csv", "platform,url,extra\nok,https://a.example/1,z\n")}, want: []string{"line 1", `"extra"`, "column 3"}},
		{name: "csv column twice", args: []string{file("twice.csv", "platform,url,url\nok,https://a.example/1,x\n")}, want: []string{"line 1", "twice"}},
		{name: "csv no url column", args: []string{file("nourl.csv", "platform,interval\nok,1h\n")}, want: []string{"line 1", "platform and url"}},
		{name: "csv more fields than the header", args: []string{file("fields.csv", "platform,url\nok,https://a.example/1,1h\n")}, want: []string{"line 2", "fields"}},
		{name: "csv interval below 1s", args: []string{file("ns.csv", "platform,url,interval\nok,https://a.example/1,1ns\n")}, want: []string{"line 2", "interval", "1ns"}},
		{name: "csv unknown platform", args: []string{file("plat.csv", "platform,url\nnope,https://a.example/1\n")}, want: []string{"line 2", "nope"}},
		{name: "csv 10,000 lines, three bad ones", args: []string{file("big.csv", big.String())}, want: []string{"line 5000", "line 7000", "line 9000", "interval", "2048 bytes", "UTF-8"}},
		{name: "csv URL with a password and a bad scheme", args: []string{file("cred.csv", "platform,url\nok,ftp://u:s3cr3tCSV@a.example/\n")}, want: []string{"line 2", "url"}, secret: "s3cr3tCSV"},
		{name: "csv BOM, then an unknown column", args: []string{file("bom.csv", "\ufeff\"platform\",\"url\",\"x\"\nok,https://a.example/1,1\n")}, want: []string{"line 1", `"x"`}},
		{name: "json two objects on one line", args: []string{file("two.jsonl", jsonLine("https://a.example/1")+jsonLine("https://a.example/2")+"\n")}, want: []string{"line 1", "one object per line"}},
		{name: "json trailing garbage", args: []string{file("tail.jsonl", jsonLine("https://a.example/1")+"\n"+jsonLine("https://a.example/2")+" garbage\n")}, want: []string{"line 2", "after the object"}},
		{name: "json duplicate key", args: []string{file("dup.jsonl", `{"platform":"ok","url":"https://a.example/1","url":"https://a.example/2"}`+"\n")}, want: []string{"line 1", "url is given twice"}},
		{name: "json unknown key", args: []string{file("key.jsonl", `{"platform":"ok","url":"https://a.example/1","priority":1}`+"\n")}, want: []string{"line 1", `"priority"`}},
		{name: "json number for a string", args: []string{file("num.jsonl", `{"platform":"ok","url":42}`+"\n")}, want: []string{"line 1", "url must be a JSON string"}},
		{name: "json line over 1 MiB", args: []string{file("long.jsonl", jsonLine("https://a.example/1")+"\n"+jsonLine("https://a.example/"+strings.Repeat("b", 1<<20))+"\n")}, want: []string{"line 2", "longer than 1048576 bytes"}},
		{name: "json invalid UTF-8", args: []string{file("utf.jsonl", jsonLine("https://a.example/\xff")+"\n")}, want: []string{"line 1", "UTF-8"}},
		{name: "json URL with a password and a bad scheme", args: []string{file("cred.jsonl", jsonLine("gopher://u:s3cr3tJSON@a.example/")+"\n")}, want: []string{"line 1", "url"}, secret: "s3cr3tJSON"},
		{name: "json not an object", args: []string{"--format", "jsonl", file("arr.txt", `["ok","https://a.example/1"]`+"\n")}, want: []string{"line 1", "object"}},
		{name: "stdin, unknown column", args: []string{"-"}, stdin: "platform,url,bogus\nok,https://a.example/1,x\n", want: []string{"line 1", `"bogus"`}},
		{name: "csv key over 200 bytes", args: []string{file("key.csv", "platform,url,key\nok,https://a.example/1,acct\nok,https://a.example/2,"+strings.Repeat("k", 201)+"\n")}, want: []string{"line 3", "key", "200 bytes"}},
		{name: "json key with a NUL", args: []string{file("nul.jsonl", `{"platform":"ok","url":"https://a.example/1","key":"a\u0000b"}`+"\n")}, want: []string{"line 1", "key", "NUL"}},
		{name: "json key not UTF-8", args: []string{file("keyutf.jsonl", `{"platform":"ok","url":"https://a.example/1","key":"a`+"\xff"+`b"}`+"\n")}, want: []string{"line 1", "UTF-8"}},
		{name: "--format xml", args: []string{"--format", "xml", file("f.csv", "platform,url\n")}, want: []string{"--format", "xml"}},
		{name: "--interval 1ns", args: []string{"--interval", "1ns", file("g.csv", "platform,url\n")}, want: []string{"--interval", "1ns"}},
		{name: "missing file", args: []string{filepath.Join(dir, "nope.csv")}, want: []string{"nope.csv", "no such file"}},
	}
	cases := []badCase{
		// The database URL: nothing after the user name is printed.
		{name: "'@' in the password", raw: true, args: []string{"--database-url", "postgres://postgres:Wr@ngPwXYZ@127.0.0.1:55433/fp", "platforms", "list"}, want: []string{"'@' appears 2 times", "%40"}, secret: "ngPwXYZ"},
		{name: "'/' in the password", raw: true, args: []string{"--database-url", "postgres://postgres:Wr/ngPwXYZ@127.0.0.1:55433/fp", "status"}, want: []string{"after a '/'", "%2F"}, secret: "ngPwXYZ"},
		{name: "upper-case PASSWORD=", raw: true, args: []string{"--database-url", "host=127.0.0.1 port=55433 PASSWORD=secretXYZ user=postgres", "status"}, want: []string{`"PASSWORD" is not a connection setting`}, secret: "secretXYZ"},
		{name: "empty user takes the password", raw: true, args: []string{"--database-url", "host=127.0.0.1 user= password=secretXYZ", "status"}, want: []string{"empty value"}, secret: "secretXYZ"},
		{name: "URL-encoded password key, unencoded '&'", raw: true, args: []string{"--database-url", "postgres://u@127.0.0.1/fp?pass%77ord=secretXYZ&more", "scan"}, want: []string{"cannot be parsed"}, secret: "secretXYZ"},
		{name: "a port that is a password", raw: true, args: []string{"--database-url", "postgres://u:secretXYZ@127.0.0.1:notaport/fp", "sources", "list"}, want: []string{"invalid port"}, secret: "secretXYZ"},
		{name: "upper-case scheme", raw: true, args: []string{"--database-url", "POSTGRES://u:secretXYZ@127.0.0.1/fp", "status"}, want: []string{"scheme"}, secret: "secretXYZ"},
		{name: "DATABASE_URL with a space in the password", raw: true, args: []string{"status"}, env: []string{"DATABASE_URL=postgres://u:se cretXYZ@127.0.0.1/fp"}, want: []string{"set by DATABASE_URL", "unexpected spaces"}, secret: "cretXYZ"},
		{name: "FLEETPACE_DATABASE_URL with '@' in the password", raw: true, args: []string{"worker"}, env: []string{"FLEETPACE_DATABASE_URL=postgres://u:Wr@ngPwXYZ@127.0.0.1/fp"}, want: []string{"set by FLEETPACE_DATABASE_URL", "'@' appears 2 times"}, secret: "ngPwXYZ"},

		// Global flags.
		{name: "--connect-timeout 2h", args: []string{"--connect-timeout", "2h", "status"}, want: []string{"--connect-timeout", "2h0m0s"}},
		{name: "--log-level loud", args: []string{"--log-level", "loud", "status"}, want: []string{"--log-level", "loud"}},
		{name: "FLEETPACE_LOG_FORMAT=xml", args: []string{"status"}, env: []string{"FLEETPACE_LOG_FORMAT=xml"}, want: []string{"--log-format", "FLEETPACE_LOG_FORMAT", "xml"}},
		{name: "--data-dir is a file", raw: true, args: []string{"--data-dir", aFile, "platforms", "list"}, want: []string{"--data-dir", aFile, "is a file"}},
		{name: "--data-dir under a file", raw: true, args: []string{"--data-dir", filepath.Join(aFile, "x"), "sources", "list"}, want: []string{"--data-dir", "a parent"}},
		{name: "embedded status of a file", raw: true, args: []string{"--data-dir", aFile, "embedded", "status"}, want: []string{aFile, "is a file"}},
		{name: "--data-dir empty", raw: true, args: []string{"--data-dir", "", "status"}, want: []string{"--data-dir must not be empty"}},

		// Unknown commands, at every level.
		{name: "unknown command", args: []string{"nosuch"}, want: []string{`unknown command "nosuch"`}},
		{name: "unknown flag", args: []string{"status", "--no-such-flag"}, want: []string{"unknown flag", "--no-such-flag"}},
		{name: "bench nosuch", args: []string{"bench", "nosuch"}, want: []string{`unknown command "nosuch" for "fleetpace bench"`}},
		{name: "sources nosuch", args: []string{"sources", "nosuch"}, want: []string{`unknown command "nosuch" for "fleetpace sources"`}},
		{name: "platforms nosuch", args: []string{"platforms", "nosuch"}, want: []string{`unknown command "nosuch" for "fleetpace platforms"`}},
		{name: "schema nosuch", args: []string{"schema", "nosuch"}, want: []string{`unknown command "nosuch" for "fleetpace schema"`}},
		{name: "embedded nosuch", args: []string{"embedded", "nosuch"}, want: []string{`unknown command "nosuch" for "fleetpace embedded"`}},
		{name: "simulate nosuch", args: []string{"simulate", "nosuch"}, want: []string{`unknown command "nosuch" for "fleetpace simulate"`}},
		{name: "status with an argument", args: []string{"status", "extra"}, want: []string{"takes no arguments", "extra"}},
		{name: "schema apply with an argument", args: []string{"schema", "apply", "extra"}, want: []string{"takes no arguments"}},
		{name: "version with an argument", args: []string{"version", "extra"}, want: []string{"takes no arguments"}},
		{name: "--pooler bogus", args: []string{"--pooler", "bogus", "status"}, want: []string{"--pooler", "bogus", "auto, none, transaction"}},

		// platforms set (on the existing platform too: it stays as it was).
		{name: "--rate 1e-300", args: []string{"platforms", "set", "ok", "--rate", "1e-300"}, want: []string{"--rate", "1e-300", "0.0001"}},
		{name: "--rate 1e10", args: []string{"platforms", "set", "fast", "--rate", "1e10"}, want: []string{"--rate", "1e+10"}},
		{name: "--rate NaN", args: []string{"platforms", "set", "nan", "--rate", "NaN"}, want: []string{"--rate", "NaN"}},
		{name: "--rate missing", args: []string{"platforms", "set", "norate"}, want: []string{"--rate is required"}},
		{name: "--burst 2147483648", args: []string{"platforms", "set", "ok", "--rate", "5", "--burst", "2147483648"}, want: []string{"--burst", "2147483648"}},
		{name: "--decay-after 99999999999", args: []string{"platforms", "set", "ok", "--rate", "5", "--decay-after", "99999999999"}, want: []string{"--decay-after", "99999999999"}},
		{name: "--cooldown 1ns", args: []string{"platforms", "set", "ok", "--rate", "5", "--cooldown", "1ns"}, want: []string{"--cooldown", "1ns"}},
		{name: "--cooldown 25h", args: []string{"platforms", "set", "ok", "--rate", "5", "--cooldown", "25h"}, want: []string{"--cooldown", "25h"}},
		{name: "--max-multiplier 1e308", args: []string{"platforms", "set", "ok", "--rate", "5", "--max-multiplier", "1e308"}, want: []string{"--max-multiplier", "1e+308"}},
		{name: "--backoff-factor 1", args: []string{"platforms", "set", "ok", "--rate", "5", "--backoff-factor", "1"}, want: []string{"--backoff-factor"}},
		{name: "--recovery-factor 17", args: []string{"platforms", "set", "ok", "--rate", "5", "--recovery-factor", "17"}, want: []string{"--recovery-factor", "17"}},
		{name: "platform NAME", args: []string{"platforms", "set", "Bad Name", "--rate", "5"}, want: []string{"NAME must be lower-case", "Bad Name"}},
		// platforms set on an existing platform changes only the flags given:
		// each is bounded all the same.
		{name: "partial --burst 2000000", args: []string{"platforms", "set", "ok", "--burst", "2000000"}, want: []string{"--burst", "2000000", "1000000"}},
		{name: "partial --cooldown 25h", args: []string{"platforms", "set", "ok", "--cooldown", "25h"}, want: []string{"--cooldown", "25h"}},
		{name: "partial --rate 1e-300", args: []string{"platforms", "set", "ok", "--rate", "1e-300"}, want: []string{"--rate", "1e-300"}},
		{name: "partial --max-multiplier 0.5", args: []string{"platforms", "set", "ok", "--max-multiplier", "0.5"}, want: []string{"--max-multiplier", "0.5"}},
		{name: "new platform without --rate", args: []string{"platforms", "set", "other", "--burst", "3"}, want: []string{"--rate is required"}},

		// Nested limits: platforms set's per-key and in-flight flags, keys.
		{name: "--key-rate 1e-300", args: []string{"platforms", "set", "ok", "--key-rate", "1e-300"}, want: []string{"--key-rate", "1e-300"}},
		{name: "--key-rate -1", args: []string{"platforms", "set", "ok", "--key-rate", "-1"}, want: []string{"--key-rate", "-1"}},
		{name: "--key-burst 0", args: []string{"platforms", "set", "ok", "--key-burst", "0"}, want: []string{"--key-burst", "[1, 1000000]"}},
		{name: "--max-in-flight 20000", args: []string{"platforms", "set", "ok", "--max-in-flight", "20000"}, want: []string{"--max-in-flight", "20000", "10000"}},
		{name: "--key-max-in-flight -1", args: []string{"platforms", "set", "ok", "--key-max-in-flight", "-1"}, want: []string{"--key-max-in-flight", "-1"}},
		{name: "new platform with only --key-rate", args: []string{"platforms", "set", "other", "--key-rate", "2"}, want: []string{"--rate is required"}},
		{name: "keys set nothing", args: []string{"keys", "set", "ok", "acct"}, want: []string{"--rate or burst"}},
		{name: "keys set --rate 0", args: []string{"keys", "set", "ok", "acct", "--rate", "0"}, want: []string{"--rate", "[0.0001, 1e+09]"}},
		{name: "keys set --burst 0", args: []string{"keys", "set", "ok", "acct", "--burst", "0"}, want: []string{"--burst", "0"}},
		{name: "keys set --max-in-flight 10001", args: []string{"keys", "set", "ok", "acct", "--max-in-flight", "10001"}, want: []string{"--max-in-flight", "10001"}},
		{name: "keys set unknown platform", args: []string{"keys", "set", "nope", "acct", "--rate", "1"}, want: []string{"PLATFORM", "nope"}},
		{name: "keys set empty KEY", args: []string{"keys", "set", "ok", "", "--rate", "1"}, want: []string{"KEY must not be empty"}},
		{name: "keys set KEY over 200 bytes", args: []string{"keys", "set", "ok", strings.Repeat("k", 300), "--rate", "1"}, want: []string{"KEY", "200 bytes"}},
		{name: "keys set KEY not UTF-8", args: []string{"keys", "set", "ok", "a\xff", "--rate", "1"}, want: []string{"KEY", "UTF-8"}},
		{name: "keys set without KEY", args: []string{"keys", "set", "ok", "--rate", "1"}, want: []string{"exactly 2"}},
		{name: "keys list unknown platform", args: []string{"keys", "list", "nope"}, want: []string{`"nope"`}},
		{name: "keys list --limit 20000", args: []string{"keys", "list", "ok", "--limit", "20000"}, want: []string{"--limit", "20000"}},
		{name: "keys list --after over 200 bytes", args: []string{"keys", "list", "ok", "--after", strings.Repeat("k", 201)}, want: []string{"--after", "200 bytes"}},
		{name: "keys delete without limits", args: []string{"keys", "delete", "ok", "acct"}, want: []string{`"acct"`, "no limits of its own"}},
		{name: "keys delete unknown platform", args: []string{"keys", "delete", "nope", "acct"}, want: []string{`"nope"`}},
		{name: "keys nosuch", args: []string{"keys", "nosuch"}, want: []string{`unknown command "nosuch" for "fleetpace keys"`}},

		// platforms pause, resume, delete; cooldowns clear.
		{name: "pause --for -1s", args: []string{"platforms", "pause", "ok", "--for", "-1s"}, want: []string{"--for", "-1s"}},
		{name: "pause --for 9000h", args: []string{"platforms", "pause", "ok", "--for", "9000h"}, want: []string{"--for", "9000h", "8760h"}},
		{name: "pause --reason of 600 bytes", args: []string{"platforms", "pause", "ok", "--reason", strings.Repeat("r", 600)}, want: []string{"--reason", "500 bytes"}},
		{name: "pause --reason not UTF-8", args: []string{"platforms", "pause", "ok", "--reason", "bad \xff"}, want: []string{"--reason", "UTF-8"}},
		{name: "pause unknown platform", args: []string{"platforms", "pause", "nope"}, want: []string{`"nope"`}},
		{name: "resume unknown platform", args: []string{"platforms", "resume", "nope"}, want: []string{`"nope"`}},
		{name: "delete with sources", args: []string{"platforms", "delete", "ok"}, want: []string{"--with-sources"}},
		{name: "cooldowns clear unknown", args: []string{"cooldowns", "clear", "nope"}, want: []string{`"nope"`}},
		{name: "cooldowns nosuch", args: []string{"cooldowns", "nosuch"}, want: []string{`unknown command "nosuch" for "fleetpace cooldowns"`}},
		{name: "help nosuch", args: []string{"help", "nosuch"}, want: []string{`unknown help topic "nosuch"`}},

		// sources add, list, remove.
		{name: "--interval 1ns", args: []string{"sources", "add", "--platform", "ok", "--url", "https://a.example/", "--interval", "1ns"}, want: []string{"--interval", "1ns"}},
		{name: "--interval 9000h", args: []string{"sources", "add", "--platform", "ok", "--url", "https://a.example/", "--interval", "9000h"}, want: []string{"--interval", "9000h"}},
		{name: "100,000-character URL", args: []string{"sources", "add", "--platform", "ok", "--url", hugeURL}, want: []string{"--url", "2048 bytes", "100018"}},
		{name: "URL with invalid UTF-8", args: []string{"sources", "add", "--platform", "ok", "--url", "https://a.example/\xff"}, want: []string{"--url", "UTF-8"}},
		{name: "URL with a control character", args: []string{"sources", "add", "--platform", "ok", "--url", "https://a.example/\x01"}, want: []string{"--url", "control"}},
		{name: "URL with a port out of range", args: []string{"sources", "add", "--platform", "ok", "--url", "https://a.example:99999/"}, want: []string{"--url", "port"}},
		{name: "URL with a password, bad scheme", args: []string{"sources", "add", "--platform", "ok", "--url", "ftp://u:s3cr3tSRC@a.example/"}, want: []string{"--url", "xxxxx@a.example"}, secret: "s3cr3tSRC"},
		{name: "unknown platform", args: []string{"sources", "add", "--platform", "nope", "--url", "https://a.example/"}, want: []string{"--platform", "nope"}},
		{name: "--key over 200 bytes", args: []string{"sources", "add", "--platform", "ok", "--url", "https://a.example/k", "--key", strings.Repeat("é", 101)}, want: []string{"--key", "200 bytes", "202"}},
		{name: "--key not UTF-8", args: []string{"sources", "add", "--platform", "ok", "--url", "https://a.example/k", "--key", "acct\xff"}, want: []string{"--key", "UTF-8"}},
		{name: "sources list --key over 200 bytes", args: []string{"sources", "list", "--key", strings.Repeat("k", 201)}, want: []string{"--key", "200 bytes"}},
		{name: "sources list --limit -5", args: []string{"sources", "list", "--limit", "-5"}, want: []string{"--limit", "-5"}},
		{name: "sources list --limit 2000000", args: []string{"sources", "list", "--limit", "2000000"}, want: []string{"--limit", "2000000"}},
		{name: "sources list --failing -1", args: []string{"sources", "list", "--failing", "-1"}, want: []string{"--failing", "-1"}},
		{name: "sources list --failing 2147483647", args: []string{"sources", "list", "--failing", "2147483647"}, want: []string{"--failing", "2147483647"}},
		{name: "sources list --outcome boom", args: []string{"sources", "list", "--outcome", "boom"}, want: []string{"--outcome", "boom"}},
		{name: "sources show --history 20000", args: []string{"sources", "show", "1", "--history", "20000"}, want: []string{"--history", "20000"}},
		{name: "sources show unknown", args: []string{"sources", "show", "424242"}, want: []string{"424242", "not found"}},
		{name: "sources set --interval 1ns", args: []string{"sources", "set", "1", "--interval", "1ns"}, want: []string{"--interval", "1ns"}},
		{name: "sources set --interval 9000h", args: []string{"sources", "set", "1", "--interval", "9000h"}, want: []string{"--interval", "9000h"}},
		{name: "sources set nothing", args: []string{"sources", "set", "1"}, want: []string{"--interval or enabled"}},
		{name: "sources disable --failing 99999999999", args: []string{"sources", "disable", "--failing", "99999999999"}, want: []string{"--failing", "99999999999"}},
		{name: "sources enable unknown id", args: []string{"sources", "enable", "1", "424242"}, want: []string{"424242", "nothing changed"}},
		{name: "sources remove abc", args: []string{"sources", "remove", "abc"}, want: []string{`"abc"`}},
		{name: "sources remove unknown", args: []string{"sources", "remove", "1", "424242"}, want: []string{"424242"}},

		// enqueue, scan, drain.
		{name: "enqueue unknown id", args: []string{"enqueue", "1", "99999"}, want: []string{"99999", "nothing queued"}},
		{name: "enqueue unknown platform", args: []string{"enqueue", "--platform", "nope"}, want: []string{"nope"}},
		{name: "enqueue nothing", args: []string{"enqueue"}, want: []string{"source IDs or --platform"}},
		{name: "scan --limit 9223372036854775807", args: []string{"scan", "--limit", "9223372036854775807"}, want: []string{"--limit", "9223372036854775807"}},
		{name: "scan --look-ahead 2h", args: []string{"scan", "--look-ahead", "2h"}, want: []string{"--look-ahead", "2h0m0s"}},
		{name: "FLEETPACE_PER_PLATFORM_CAP=200000", args: []string{"scan"}, env: []string{"FLEETPACE_PER_PLATFORM_CAP=200000"}, want: []string{"--per-platform-cap", "FLEETPACE_PER_PLATFORM_CAP", "200000"}},
		{name: "scan --history-retention -1h", args: []string{"scan", "--history-retention", "-1h"}, want: []string{"--history-retention", "-1h"}},
		{name: "scan --history-retention 9000h", args: []string{"scan", "--history-retention", "9000h"}, want: []string{"--history-retention", "9000h"}},
		{name: "FLEETPACE_HISTORY_RETENTION=9000h", args: []string{"worker"}, env: []string{"FLEETPACE_HISTORY_RETENTION=9000h"}, want: []string{"--history-retention", "FLEETPACE_HISTORY_RETENTION", "9000h"}},
		{name: "status --interval 1ns", args: []string{"status", "--watch", "--interval", "1ns"}, want: []string{"--interval", "1ns"}},
		{name: "status --interval 2h", args: []string{"status", "--watch", "--interval", "2h"}, want: []string{"--interval", "2h0m0s"}},
		{name: "drain --max-body-bytes 9223372036854775807", args: []string{"drain", "--max-body-bytes", "9223372036854775807"}, want: []string{"--max-body-bytes", "9223372036854775807"}},
		{name: "drain --job-timeout 1ns", args: []string{"drain", "--job-timeout", "1ns"}, want: []string{"--job-timeout", "1ns"}},
		{name: "drain --max-duration -1s", args: []string{"drain", "--max-duration", "-1s"}, want: []string{"--max-duration", "-1s"}},
		{name: "drain --max-redirects 1000", args: []string{"drain", "--max-redirects", "1000"}, want: []string{"--max-redirects", "1000"}},
		{name: "FLEETPACE_TEST_GUARD_EXEMPT is no variable", args: []string{"drain", "--max-duration", "-1s"}, env: []string{"FLEETPACE_TEST_GUARD_EXEMPT=junkGuardXYZ"}, want: []string{"--max-duration"}, secret: "junkGuardXYZ"},
		{name: "drain --test-guard-exempt junk", args: []string{"drain", "--test-guard-exempt", "junk"}, want: []string{"junk", "ADDRESS:PORT"}},

		// worker.
		{name: "worker --bench-local-pacer p=tcp:1", args: []string{"worker", "--bench-local-pacer", "p=tcp:1"}, want: []string{"--bench-local-pacer", "oracle or aws"}},
		{name: "worker --bench-local-pacer twice", args: []string{"worker", "--bench-local-pacer", "p=aws:1", "--bench-local-pacer", "p=oracle:1"}, want: []string{"--bench-local-pacer", "named twice"}},
		{name: "worker --http-addr foo", args: []string{"worker", "--http-addr", "foo"}, want: []string{"--http-addr", `"foo"`}},
		{name: "worker --http-addr :99999", args: []string{"worker", "--http-addr", ":99999"}, want: []string{"--http-addr", ":99999"}},
		{name: "worker --http-addr :-1", args: []string{"worker", "--http-addr", ":-1"}, want: []string{"--http-addr", ":-1"}},
		{name: "worker --heartbeat -1s", args: []string{"worker", "--heartbeat", "-1s"}, want: []string{"--heartbeat", "-1s"}},
		{name: "worker --heartbeat 1ns", args: []string{"worker", "--heartbeat", "1ns"}, want: []string{"--heartbeat", "1ns"}},
		{name: "worker --concurrency 20000", args: []string{"worker", "--concurrency", "20000"}, want: []string{"--concurrency", "20000"}},
		{name: "worker --poll-base 1ns", args: []string{"worker", "--poll-base", "1ns"}, want: []string{"--poll-base", "1ns"}},
		{name: "worker --startup-jitter 2h", args: []string{"worker", "--startup-jitter", "2h"}, want: []string{"--startup-jitter", "2h0m0s"}},
		{name: "worker --min-fleet-size 2147483648", args: []string{"worker", "--min-fleet-size", "2147483648"}, want: []string{"--min-fleet-size", "2147483648"}},
		{name: "worker --rate-limited-after 48h", args: []string{"worker", "--rate-limited-after", "48h"}, want: []string{"--rate-limited-after", "48h0m0s"}},
		{name: "worker --lease-ttl 2h", args: []string{"worker", "--lease-ttl", "2h"}, want: []string{"--lease-ttl", "2h0m0s"}},
		{name: "worker --lease-ttl 1ms", args: []string{"worker", "--lease-ttl", "1ms"}, want: []string{"--lease-ttl", "1ms"}},
		{name: "worker --max-pacer-wait 2h", args: []string{"worker", "--max-pacer-wait", "2h"}, want: []string{"--max-pacer-wait", "2h0m0s"}},
		{name: "worker --listen-idle 2h", args: []string{"worker", "--listen-idle", "2h"}, want: []string{"--listen-idle", "2h0m0s"}},
		{name: "FLEETPACE_HEARTBEAT=1ns", args: []string{"worker"}, env: []string{"FLEETPACE_HEARTBEAT=1ns"}, want: []string{"--heartbeat", "FLEETPACE_HEARTBEAT", "1ns"}},
		{name: "FLEETPACE_HTTP_ADDR=foo", args: []string{"worker"}, env: []string{"FLEETPACE_HTTP_ADDR=foo"}, want: []string{"--http-addr", "FLEETPACE_HTTP_ADDR"}},
		{name: "worker short token on 0.0.0.0", args: []string{"worker", "--http-addr", "0.0.0.0:0", "--admin-token", "shortTOKENxyz"}, want: []string{"--admin-token", "32 bytes", "0.0.0.0"}, secret: "shortTOKENxyz"},
		{name: "worker short token on every interface", args: []string{"worker", "--http-addr", ":0"}, env: []string{"FLEETPACE_ADMIN_TOKEN=envTOKENxyz"}, want: []string{"--admin-token", "32 bytes"}, secret: "envTOKENxyz"},
		{name: "worker token of a space", args: []string{"worker", "--admin-token", " "}, want: []string{"--admin-token", "space"}},
		{name: "worker --allowed-host with a path", args: []string{"worker", "--allowed-host", "a.example/x"}, want: []string{"--allowed-host", "a.example/x"}},
		{name: "dashboard short token on 0.0.0.0", args: []string{"dashboard", "--http-addr", "0.0.0.0:0", "--admin-token", "shortTOKENxyz"}, want: []string{"--admin-token", "32 bytes"}, secret: "shortTOKENxyz"},
		{name: "dashboard token with a newline", args: []string{"dashboard", "--admin-token", "tok\nENxyz"}, want: []string{"--admin-token", "control"}, secret: "ENxyz"},
		{name: "dashboard --allowed-host empty", args: []string{"dashboard", "--allowed-host", "@"}, want: []string{"--allowed-host"}},
		{name: "--secret-params with a space", args: []string{"status", "--secret-params", "a b"}, want: []string{"--secret-params", `"a b"`}},

		// demo, simulate, bench.
		{name: "demo --chart out.gif", args: []string{"demo", "--chart", filepath.Join(dir, "out.gif")}, want: []string{"--chart", "out.gif", ".svg or .png"}},
		{name: "demo --workers 40", args: []string{"demo", "--workers", "40"}, want: []string{"--workers", "40"}},
		{name: "simulate herd --pollers 2000000", args: []string{"simulate", "herd", "--pollers", "2000000"}, want: []string{"Pollers", "2000000"}},
		{name: "bench worker --jobs -1", args: []string{"bench", "worker", "--jobs", "-1"}, want: []string{"--jobs", "-1"}},
		{name: "bench worker --cpu-profile in no directory", args: []string{"bench", "worker", "--cpu-profile", filepath.Join(dir, "none", "cpu.prof")}, want: []string{"--cpu-profile", "cpu.prof"}},
		{name: "bench pacer --ceiling 2e9", args: []string{"bench", "pacer", "--ceiling", "2e9"}, want: []string{"--ceiling", "2e+09"}},
		{name: "bench pacer --burst 2000000", args: []string{"bench", "pacer", "--burst", "2000000"}, want: []string{"--burst", "2000000"}},
	}
	for _, c := range imports {
		c.name = "import: " + c.name
		c.args = append([]string{"sources", "import"}, c.args...)
		cases = append(cases, c)
	}
	if len(cases) < 60 {
		t.Fatalf("the battery has %d cases, want at least 60", len(cases))
	}

	before := snapshot(t, pool)
	for _, c := range cases {
		args := c.args
		if !c.raw {
			args = append([]string{"-q", "--database-url", url}, args...)
		}
		r := runEnvStdin(t, c.env, c.stdin, args...)
		out := r.stdout + r.stderr
		switch {
		case r.code != 2:
			t.Errorf("%s: exit %d, want 2\n%s", c.name, r.code, r)
		case strings.Contains(out, "panic") || strings.Contains(out, "goroutine "):
			t.Errorf("%s: panicked\n%s", c.name, r)
		case c.secret != "" && strings.Contains(out, c.secret):
			t.Errorf("%s: printed the secret %q\n%s", c.name, c.secret, r)
		case len(out) > 10_000:
			t.Errorf("%s: %d bytes of output: a value is not clipped", c.name, len(out))
		}
		for _, w := range c.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: stderr does not name %q\n%s", c.name, w, r)
			}
		}
		if after := snapshot(t, pool); after != before {
			t.Fatalf("%s wrote something:\nbefore %s\nafter  %s", c.name, before, after)
		}
	}

	// A source URL's credentials are in no output.
	for _, args := range [][]string{{"sources", "list"}, {"sources", "list", "--json"}} {
		r := run(t, "", append([]string{"-q", "--database-url", url}, args...)...)
		if r.code != 0 || strings.Contains(r.stdout+r.stderr, "s3cr3tLIST") || !strings.Contains(r.stdout, "alice:xxxxx@creds.example/feed") {
			t.Errorf("%v: want the URL with its password replaced\n%s", args, r)
		}
	}
}

// runEnvStdin runs the binary to its end with env on top of a clean
// environment (no DATABASE_URL, no FLEETPACE_ variable) and stdin.
func runEnvStdin(t *testing.T, env []string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := envCommand(ctx, env, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); cmd.ProcessState == nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String(), elapsed: time.Since(start)}
}
