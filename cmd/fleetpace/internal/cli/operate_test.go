package cli_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/status"
)

// dbq runs fleetpace with -q on url and fails the test unless it exits 0.
func dbq(t *testing.T, url string, args ...string) result {
	t.Helper()
	r := run(t, "", append([]string{"-q", "--database-url", url}, args...)...)
	if r.code != 0 {
		t.Fatalf("%v: %s", args, r)
	}
	return r
}

// Every new command: bad input exits 2 naming the field (or the argument),
// an unknown platform or source exits 2, and nothing is written. Unknown
// subcommands exit 2 everywhere.
func TestOperateBadInput(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	dbq(t, url, "platforms", "set", "feeds", "--rate", "7", "--burst", "2")
	dbq(t, url, "sources", "add", "--platform", "feeds", "--url", "https://feeds.example/a")
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	before := snapshot(t, pool)
	tests := []struct {
		args []string
		want string // in stderr
	}{
		{[]string{"platforms", "set", "feeds", "--burst", "0"}, "--burst must be in [1, 1000000]"},
		{[]string{"platforms", "set", "feeds", "--rate", "-3"}, "--rate must be in [0.0001, 1e+09]"},
		{[]string{"platforms", "set", "new", "--burst", "3"}, "--rate is required for a new platform"},
		{[]string{"platforms", "pause"}, "NAME"},
		{[]string{"platforms", "pause", "nope"}, `platform "nope"`},
		{[]string{"platforms", "pause", "feeds", "--for", "-1s"}, "--for must be in (0, 8760h0m0s]"},
		{[]string{"platforms", "pause", "feeds", "--for", "soon"}, "--for"},
		{[]string{"platforms", "resume", "nope"}, `platform "nope"`},
		{[]string{"platforms", "resume", "a", "b"}, "NAME"},
		{[]string{"platforms", "delete", "nope"}, `platform "nope"`},
		{[]string{"platforms", "delete", "feeds"}, "--with-sources must be set"},
		{[]string{"cooldowns", "clear", "nope"}, `platform "nope"`},
		{[]string{"cooldowns", "clear"}, "NAME"},
		{[]string{"sources", "show", "999999"}, "source 999999: not found"},
		{[]string{"sources", "show", "abc"}, "ID|URL is neither an id nor a source's URL"},
		{[]string{"sources", "show", "https://feeds.example/none"}, "not found"},
		{[]string{"sources", "show", "1", "--history", "-1"}, "--history"},
		{[]string{"sources", "set", "1"}, "--interval or enabled must be given"},
		{[]string{"sources", "set", "1", "--interval", "0s"}, "--interval must be in [1s, 8760h]"},
		{[]string{"sources", "set", "999999", "--interval", "1h"}, "not found"},
		{[]string{"sources", "disable"}, "ID or platform or min_failures must be given"},
		{[]string{"sources", "disable", "1", "999999"}, "ID does not exist; nothing changed (got \"999999\")"},
		{[]string{"sources", "disable", "--platform", "nope"}, "--platform does not exist"},
		{[]string{"sources", "disable", "--failing", "-1"}, "--failing must be in [0, 2147483646]"},
		{[]string{"sources", "enable", "1", "--platform", "feeds"}, "excludes platform"},
		{[]string{"sources", "enable", "x"}, `ID "x" is not a positive integer`},
		{[]string{"sources", "list", "--outcome", "boom"}, "--outcome must be one of ok, not_modified"},
		{[]string{"sources", "list", "--failing", "-2"}, "--failing must be in [0, 2147483646]"},
		{[]string{"sources", "list", "--platform", "nope"}, "--platform does not exist"},
		{[]string{"sources", "remove", "999999"}, "999999"},
		{[]string{"status", "--watch", "--interval", "0s"}, "--interval: must be in [100ms, 1h0m0s]"},
		{[]string{"scan", "--history-retention", "-1h"}, "--history-retention"},
		{[]string{"worker", "--history-retention", "soon"}, "--history-retention"},
		{[]string{"platforms", "bogus"}, `unknown command "bogus" for "fleetpace platforms"`},
		{[]string{"sources", "lst"}, "Did you mean this?"},
		{[]string{"cooldowns", "bogus"}, "unknown command"},
		{[]string{"schema", "bogus"}, "unknown command"},
		{[]string{"embedded", "bogus"}, "unknown command"},
		{[]string{"bench", "bogus"}, "unknown command"},
		{[]string{"simulate", "bogus"}, "unknown command"},
		{[]string{"help", "bogus"}, "unknown help topic"},
	}
	for _, tt := range tests {
		r := run(t, "", append([]string{"-q", "--database-url", url}, tt.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tt.want) {
			t.Errorf("%v: want exit 2 mentioning %q; got %s", tt.args, tt.want, r)
		}
	}
	if after := snapshot(t, pool); after != before {
		t.Fatalf("refused commands wrote to the database")
	}
}

// Changing only --burst keeps the rate, the cooldown, the multiplier and
// every other setting.
func TestPlatformsSetPartial(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	dbq(t, url, "platforms", "set", "feeds", "--rate", "7", "--burst", "2", "--cooldown", "20m", "--max-multiplier", "8",
		"--decay-after", "50", "--backoff-factor", "2", "--recovery-factor", "1.5", "--probe=false", "--rate-limit-headers=false",
		"--adapt", "multiplier")
	r := dbq(t, url, "platforms", "set", "feeds", "--burst", "3")
	if !strings.Contains(r.stdout, "platform feeds updated: rate 7/s, burst 3, cooldown 20m0s, max multiplier 8") {
		t.Fatalf("set --burst 3: %s", r)
	}
	var ps []sources.Platform
	if err := json.Unmarshal([]byte(dbq(t, url, "platforms", "list", "--json").stdout), &ps); err != nil {
		t.Fatal(err)
	}
	want := sources.Platform{Name: "feeds", RatePerSec: 7, Burst: 3, Cooldown: 20 * time.Minute, MaxMultiplier: 8,
		DecayAfter: 50, BackoffFactor: 2, RecoveryFactor: 1.5, NoProbe: true, IgnoreHeaders: true, Adapt: sources.AdaptMultiplier, KeyBurst: 1}
	if len(ps) != 1 || ps[0] != want {
		t.Fatalf("after --burst 3: %+v, want %+v", ps, want)
	}
}

// sources show: three checks with different outcomes, newest first, with
// their reasons; a refusal by the SSRF guard with the hint; the source
// found by its URL too; credentials never shown.
func TestSourcesShowHistory(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	dbq(t, url, "platforms", "set", "feeds", "--rate", "7")
	dbq(t, url, "sources", "add", "--platform", "feeds", "--url", "https://user:s3cret@feeds.example/a")
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, c := range []sources.Check{
		{Outcome: "ok", Status: 200, Bytes: 512, Worker: "w1"},
		{Outcome: "failed", Status: 404, Error: "HTTP 404 Not Found", Worker: "w2"},
		{Outcome: "failed", Error: "refused: 127.0.0.1 is a loopback address", Worker: "w1"},
	} {
		if err := sources.RecordCheck(context.Background(), pool, 1, c); err != nil {
			t.Fatal(err)
		}
	}
	for _, ref := range []string{"1", "https://user:s3cret@feeds.example/a"} {
		out := dbq(t, url, "sources", "show", ref).stdout
		if strings.Contains(out, "s3cret") || !strings.Contains(out, "https://user:xxxxx@feeds.example/a") {
			t.Fatalf("show %s: credentials not redacted:\n%s", ref, out)
		}
		iRefused := strings.Index(out, "refused: 127.0.0.1 is a loopback address (use --allow-private-networks)")
		i404 := strings.LastIndex(out, "HTTP 404 Not Found")
		iOK := strings.LastIndex(out, " ok ")
		if !strings.Contains(out, "state         failing (2 in a row)") || iRefused < 0 || i404 < 0 || iOK < 0 {
			t.Fatalf("show %s: want the state and the three checks with their reasons:\n%s", ref, out)
		}
		if !(strings.LastIndex(out, "refused:") < i404 && i404 < iOK) {
			t.Fatalf("show %s: checks not newest first:\n%s", ref, out)
		}
	}
	var rep status.SourceReport
	if err := json.Unmarshal([]byte(dbq(t, url, "sources", "show", "1", "--json").stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.History) != 3 || rep.History[0].Reason != "refused: 127.0.0.1 is a loopback address" || rep.History[2].Outcome != "ok" || rep.Source.ID != 1 {
		t.Fatalf("show --json: %+v", rep)
	}
	list := dbq(t, url, "sources", "list", "--outcome", "failed").stdout
	if !strings.Contains(list, "(use --allow-private-networks)") || strings.Contains(list, "s3cret") {
		t.Fatalf("sources list: want the reason with its hint, no credentials:\n%s", list)
	}
}

// status: one compact line per platform — a cooldown's long reason does
// not make it wide — and the due count is what sources list --due lists.
func TestStatusCompactAndDue(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	for _, p := range []string{"cool", "open", "paused"} {
		dbq(t, url, "platforms", "set", p, "--rate", "5")
		dbq(t, url, "sources", "add", "--platform", p, "--url", "https://"+p+".example/1")
		dbq(t, url, "sources", "add", "--platform", p, "--url", "https://"+p+".example/2")
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	long := "HTTP 429 Too Many Requests, Retry-After 600 s, from a very talkative destination that explains itself at length"
	if _, _, err := sources.SetCooldown(context.Background(), pool, "cool", 600*time.Second, long, 0.5); err != nil {
		t.Fatal(err)
	}
	dbq(t, url, "platforms", "pause", "paused", "--reason", "maintenance")
	out := dbq(t, url, "status").stdout
	var widest int
	for _, line := range strings.Split(out, "\n") {
		widest = max(widest, len([]rune(line)))
	}
	if widest > 160 || !strings.Contains(out, "cooldown ") || !strings.Contains(out, "paused (maintenance)") {
		t.Fatalf("status (widest line %d):\n%s", widest, out)
	}
	var rep status.Report
	if err := json.Unmarshal([]byte(dbq(t, url, "status", "--json").stdout), &rep); err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Platforms {
		listed := strings.Count(dbq(t, url, "sources", "list", "--due", "--platform", p.Name).stdout, "https://")
		if int64(listed) != p.Counts.Due {
			t.Errorf("platform %s: status says %d due, sources list --due lists %d", p.Name, p.Counts.Due, listed)
		}
	}
}

// status --watch prints successive snapshots when its output is not a
// terminal, and stops cleanly (exit 0) on Ctrl-C.
func TestStatusWatch(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	dbq(t, url, "platforms", "set", "feeds", "--rate", "7")
	cmd := exec.Command(binary, "-q", "--database-url", url, "status", "--watch", "--interval", "100ms")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() //nolint:errcheck // the test's end
	sc := bufio.NewScanner(stdout)
	snapshots, lines := 0, 0
	for snapshots < 3 && sc.Scan() {
		line := sc.Text()
		lines++
		if strings.HasPrefix(line, "--- ") {
			snapshots++
		}
		if strings.Contains(line, "\x1b[") {
			t.Fatalf("terminal escapes on a pipe: %q", line)
		}
	}
	if snapshots < 3 {
		t.Fatalf("%d snapshots in %d lines", snapshots, lines)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	go func() {
		for sc.Scan() { // drain
		}
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("status --watch after Ctrl-C: %v, want exit 0", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("status --watch did not stop within 10 s of Ctrl-C")
	}
}
