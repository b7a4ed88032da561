package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/internal/workers"
	"github.com/fleetpace/fleetpace/sourcefile"
	"github.com/fleetpace/fleetpace/sources"
)

// grafanaDashboard is what the test reads of deploy/grafana/fleetpace.json.
type grafanaDashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// metricRE finds the fleetpace metric names in a PromQL expression.
var metricRE = regexp.MustCompile(`\bfleetpace_[a-z0-9_]+\b`)

// The Grafana dashboard is valid JSON; every panel has a title and
// queries, and every metric its queries (and its variables) name is one a
// real worker exports: checked against the /metrics of a worker fetching
// from a destination that answers some requests 429.
func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: runs a real worker and promtool")
	}
	raw, err := os.ReadFile(filepath.Join("grafana", "fleetpace.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("grafana/fleetpace.json is not valid JSON: %v", err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("grafana/fleetpace.json: title %q, uid %q, %d panels", d.Title, d.UID, len(d.Panels))
	}
	used := map[string][]string{} // metric → where
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if p.Title == "" || len(p.Targets) == 0 || ids[p.ID] {
			t.Errorf("panel %d (%q): want a unique id, a title and queries", p.ID, p.Title)
		}
		ids[p.ID] = true
		for _, q := range p.Targets {
			names := metricRE.FindAllString(q.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q query %s names no fleetpace metric: %s", p.Title, q.RefID, q.Expr)
			}
			for _, n := range names {
				used[n] = append(used[n], fmt.Sprintf("panel %q", p.Title))
			}
		}
	}
	for _, v := range d.Templating.List {
		for _, n := range metricRE.FindAllString(v.Definition, -1) {
			used[n] = append(used[n], fmt.Sprintf("variable %q", v.Name))
		}
	}
	checkExported(t, used)
}

// The alert rules pass `promtool check rules`, their unit tests pass
// `promtool test rules`, and every metric they name is one a worker
// exports.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: runs promtool on the alert rules against a real worker")
	}
	promtool := ciTool(t, "promtool", "promtool is not installed (Debian's prometheus package: .ci/run installs it)",
		"promtool is not installed (apt-get install prometheus)")
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	raw, err := os.ReadFile(filepath.Join("prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	used := map[string][]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, n := range metricRE.FindAllString(line, -1) {
			used[n] = append(used[n], "alerts.yml")
		}
	}
	if len(used) == 0 {
		t.Fatal("alerts.yml names no fleetpace metric")
	}
	checkExported(t, used)
}

// checkExported fails for every metric in used that a worker's /metrics
// does not export.
func checkExported(t *testing.T, used map[string][]string) {
	t.Helper()
	exported := workerMetrics(t, slices.Sorted(func(yield func(string) bool) {
		for n := range used {
			if !yield(n) {
				return
			}
		}
	}))
	for n, where := range used {
		if !exported[n] {
			t.Errorf("%s names %s, which a worker does not export", strings.Join(slices.Compact(slices.Sorted(slices.Values(where))), ", "), n)
		}
	}
}

var (
	scrapeOnce sync.Once
	scraped    map[string]bool
	scrapeErr  error
)

// workerMetrics runs one real worker (once for the package's tests)
// fetching two platforms from a fake destination — one answering, one
// answering 429 with Retry-After 10 s — and returns the names of the
// series its /metrics exports once every name in want is there (or 60 s
// have passed).
func workerMetrics(t *testing.T, want []string) map[string]bool {
	t.Helper()
	scrapeOnce.Do(func() { scraped, scrapeErr = runAndScrape(t, want) })
	if scrapeErr != nil {
		t.Fatal(scrapeErr)
	}
	return scraped
}

func runAndScrape(t *testing.T, want []string) (map[string]bool, error) {
	ctx := context.Background()
	url := testdb.URL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	dest, err := fakedest.New(fakedest.Config{})
	if err != nil {
		return nil, err
	}
	if err := dest.Start(); err != nil {
		return nil, err
	}
	defer dest.Close()
	if err := dest.SetRule("/limited/", fakedest.Blocked(10*time.Second)); err != nil {
		return nil, err
	}
	var csv strings.Builder
	csv.WriteString("platform,url,interval\n")
	for _, p := range []string{"open", "limited"} {
		if _, err := sources.SetPlatform(ctx, pool, sources.Platform{Name: p, RatePerSec: 5}); err != nil {
			return nil, err
		}
		for i := range 10 {
			fmt.Fprintf(&csv, "%s,%s/%s/%d,5s\n", p, dest.URL(), p, i)
		}
	}
	if _, err := sourcefile.Import(ctx, pool, strings.NewReader(csv.String()), sourcefile.Options{}); err != nil {
		return nil, err
	}
	fl, err := workers.Start(workers.Config{Executable: binary, N: 1, Dir: t.TempDir(),
		Args: []string{"worker", "--database-url", url, "-q", "--allow-private-networks", "--http-addr", "127.0.0.1:0",
			"--startup-jitter", "0", "--poll-base", "300ms", "--poll-max", "1s", "--heartbeat", "1s", "--soft-stop", "2s"}})
	if err != nil {
		return nil, err
	}
	defer fl.Stop(context.Background()) //nolint:errcheck // the scrape is what matters
	addr, err := fl.Listening(0, 30*time.Second)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		names, err := scrape("http://" + addr + "/metrics")
		if err != nil {
			return nil, err
		}
		missing := slices.DeleteFunc(slices.Clone(want), func(n string) bool { return names[n] })
		if len(missing) == 0 || time.Now().After(deadline) {
			return names, nil
		}
		time.Sleep(500 * time.Millisecond) // the next scrape; the worker's fleet-wide gauges refresh every 10 s
	}
}

// scrape reads a Prometheus text exposition and returns its series names.
func scrape(url string) (map[string]bool, error) {
	res, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %v", url, res.StatusCode, err)
	}
	names := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names, nil
}
