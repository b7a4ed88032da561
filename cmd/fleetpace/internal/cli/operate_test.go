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

	"github.com/fleetpace/fleetpace/control"
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
	pool := testdb.PoolOf(t, url)
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
		{[]string{"sources", "set", "--platform", "nope", "--interval", "1h"}, "--platform does not exist"},
		{[]string{"sources", "set", "--platform", "feeds", "--interval", "0s"}, "--interval must be in [1s, 8760h]"},
		{[]string{"sources", "set", "--platform", "feeds"}, "--interval or enabled must be given"},
		{[]string{"sources", "set", "--platform", "Bad Name", "--interval", "1h"}, "--platform must be lower-case"},
		{[]string{"sources", "set", "1", "--platform", "feeds", "--interval", "1h"}, "one source ID or URL, or --platform, not both"},
		{[]string{"sources", "set", "--interval", "1h"}, "one source ID or URL, or --platform, not both"},
		{[]string{"sources", "check"}, "at least one source ID"},
		{[]string{"sources", "check", "x"}, `ID "x" is not a positive integer`},
		{[]string{"sources", "check", "1", "999999"}, "ID does not exist; nothing checked"},
		{[]string{"platforms", "check", "nope"}, `platform "nope"`},
		{[]string{"platforms", "check"}, "NAME"},
		{[]string{"platforms", "reset", "nope"}, `platform "nope"`},
		{[]string{"platforms", "reset"}, "NAME"},
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
// every other setting. --rate-limit-headers, the deprecated name of
// --use-headers, still sets it, and says so.
func TestPlatformsSetPartial(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	dbq(t, url, "platforms", "set", "feeds", "--rate", "7", "--burst", "2", "--cooldown", "20m", "--max-multiplier", "8",
		"--decay-after", "50", "--backoff-factor", "2", "--recovery-factor", "1.5", "--probe=false", "--use-headers=false",
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
		DecayAfter: 50, BackoffFactor: 2, RecoveryFactor: 1.5, NoProbe: true, NoUseHeaders: true, Adapt: sources.AdaptMultiplier, KeyBurst: 1}
	if len(ps) != 1 || ps[0] != want {
		t.Fatalf("after --burst 3: %+v, want %+v", ps, want)
	}
	r = dbq(t, url, "platforms", "set", "feeds", "--rate-limit-headers=true")
	if !strings.Contains(r.stdout, "use headers true") || !strings.Contains(r.stderr, "--rate-limit-headers is deprecated: use --use-headers") {
		t.Fatalf("set --rate-limit-headers=true: %s", r)
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
	pool := testdb.PoolOf(t, url)
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
	pool := testdb.PoolOf(t, url)
	long := "HTTP 429 Too Many Requests, Retry-After 600 s, from a very talkative destination that explains itself at length"
	if _, _, err := control.CoolDown(context.Background(), pool, "cool", sources.CauseStop, 600*time.Second, long, 0.5); err != nil {
		t.Fatal(err)
	}
	dbq(t, url, "platforms", "pause", "paused", "--reason", "maintenance")
	out := dbq(t, url, "status").stdout
	var widest int
	for _, line := range strings.Split(out, "\n") {
		widest = max(widest, len([]rune(line)))
	}
	if widest > 160 || !strings.Contains(out, "cooling down: rate limited, ") || !strings.Contains(out, "paused by operator until resumed (maintenance)") ||
		!strings.Contains(out, "→ the platform's 15m cooldown") {
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
	stopped(t, done, 10*time.Second, "status --watch", "Ctrl-C")
}

// While a platform is paused, enqueue says its jobs wait and sources show
// says the source is held by the pause (not "queued"); resuming it says
// resumed, and resuming it again says it was not paused.
func TestPausedPlatformSaysSo(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	dbq(t, url, "platforms", "set", "feeds", "--rate", "7")
	dbq(t, url, "sources", "add", "--platform", "feeds", "--url", "https://feeds.example/a")
	dbq(t, url, "platforms", "pause", "feeds")
	if out := dbq(t, url, "enqueue", "1").stdout; !strings.Contains(out, "enqueued 1 source(s)") ||
		!strings.Contains(out, "platform feeds is paused: its jobs wait until `fleetpace platforms resume feeds`") {
		t.Fatalf("enqueue during a pause:\n%s", out)
	}
	if out := dbq(t, url, "sources", "show", "1").stdout; !strings.Contains(out, "held by: paused") || strings.Contains(out, "held by: queued") {
		t.Fatalf("sources show of a queued source while paused:\n%s", out)
	}
	if out := dbq(t, url, "platforms", "resume", "feeds").stdout; !strings.Contains(out, "platform feeds resumed") {
		t.Fatalf("resume of a paused platform:\n%s", out)
	}
	if out := dbq(t, url, "sources", "show", "1").stdout; !strings.Contains(out, "held by: queued") {
		t.Fatalf("sources show of a queued source after the resume:\n%s", out)
	}
	if out := dbq(t, url, "platforms", "resume", "feeds").stdout; out != "platform feeds is not paused; nothing changed\n" {
		t.Fatalf("resume of a platform not paused: %q", out)
	}
	dbq(t, url, "platforms", "pause", "feeds", "--for", "1h")
	if out := dbq(t, url, "enqueue", "--platform", "feeds").stdout; !strings.Contains(out, "platform feeds is paused for ") ||
		!strings.Contains(out, " more: its jobs wait until then") {
		t.Fatalf("enqueue --platform during a pause of 1h:\n%s", out)
	}
}

// platforms reset, platforms check, sources check and sources set
// --platform do what they say, and say it.
func TestSteerCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	dbq(t, url, "platforms", "set", "feeds", "--rate", "7", "--adapt", "multiplier")
	dbq(t, url, "platforms", "set", "other", "--rate", "7")
	for _, u := range []string{"https://feeds.example/a", "https://feeds.example/b", "https://feeds.example/c"} {
		dbq(t, url, "sources", "add", "--platform", "feeds", "--url", u)
	}
	dbq(t, url, "sources", "add", "--platform", "other", "--url", "https://other.example/a")
	pool := testdb.PoolOf(t, url)
	if _, err := pool.Exec(ctx, `UPDATE fleetpace_pace SET multiplier = 16 WHERE platform = 'feeds'`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := control.CoolDown(ctx, pool, "feeds", sources.CauseSlowestPace, 10*time.Second, "HTTP 429", 0.5); err != nil {
		t.Fatal(err)
	}
	out := dbq(t, url, "status").stdout
	if !strings.Contains(out, "cooling down: max multiplier reached") || !strings.Contains(out, "throttled ×16.0") ||
		!strings.Contains(out, "a 10s Retry-After came while the platform was paced as slowly as it may be (ceiling ÷ max multiplier)") ||
		!strings.Contains(out, "→ the platform's 15m cooldown") {
		t.Fatalf("status before reset:\n%s", out)
	}
	out = dbq(t, url, "platforms", "reset", "feeds").stdout
	if !strings.Contains(out, "platform feeds reset: 7/s, burst 1 from now, fleet-wide; cooldown ended (") {
		t.Errorf("platforms reset: %s", out)
	}
	var rep status.Report
	if err := json.Unmarshal([]byte(dbq(t, url, "status", "--json").stdout), &rep); err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Platforms {
		if p.Name == "feeds" && (p.Pace.Multiplier != 1 || p.Cooldown != nil || len(p.State) != 1 || p.State[0].Kind != status.KindRunning || p.Use.EffectivePerSec != 7) {
			t.Errorf("feeds after reset: %+v", p)
		}
	}

	// sources set --platform: every source of the platform, none of another.
	out = dbq(t, url, "sources", "set", "--platform", "feeds", "--interval", "2h").stdout
	if !strings.Contains(out, "platform feeds: 3 source(s) set to interval 2h0m0s") {
		t.Errorf("sources set --platform: %s", out)
	}
	var feeds2h, other1h int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE platform = 'feeds' AND check_interval = '2 hours'),
		count(*) FILTER (WHERE platform = 'other' AND check_interval = '1 hour') FROM fleetpace_source`).Scan(&feeds2h, &other1h); err != nil || feeds2h != 3 || other1h != 1 {
		t.Errorf("after sources set --platform feeds: %d feeds sources at 2h, %d other at 1h (%v)", feeds2h, other1h, err)
	}

	// sources check: a job for a source without one; again: none more (the
	// job exists), and a disabled source is named.
	out = dbq(t, url, "sources", "check", "1").stdout
	if !strings.Contains(out, "1 source(s): 1: 1 queued now, 0 already queued made due now") {
		t.Errorf("sources check 1: %s", out)
	}
	if _, err := pool.Exec(ctx, `UPDATE river_job SET state = 'scheduled', scheduled_at = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	dbq(t, url, "sources", "disable", "2")
	out = dbq(t, url, "sources", "check", "1", "2").stdout
	if !strings.Contains(out, "0 queued now, 1 already queued made due now, 1 disabled (not checked)") {
		t.Errorf("sources check 1 2: %s", out)
	}
	var available int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE state = 'available' AND scheduled_at <= now()`).Scan(&available); err != nil || available != 1 {
		t.Errorf("after sources check of a snoozed job: %d available (%v), want 1", available, err)
	}
	out = dbq(t, url, "platforms", "check", "feeds").stdout
	if !strings.Contains(out, "platform feeds: 1 queued now, 0 already queued made due now") {
		t.Errorf("platforms check feeds: %s", out)
	}
}
