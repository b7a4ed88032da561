package dashboard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/fleet"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/status"
)

// Counts are a platform's source figures.
type Counts struct {
	Due      int64 // due now: enabled, not queued, past due_at
	Queued   int64 // a fetch job queued or running
	Failing  int64 // failed at least once in a row
	StaleMax time.Duration
	StaleP95 time.Duration // how late the late enabled sources are
}

// PlatformRow is one platform as the overview shows it.
type PlatformRow struct {
	sources.Platform
	Pace     pacer.State
	Cooldown *sources.Cooldown // nil: not cooling down
	Counts   Counts
	// Rate is requests/s over the last RateWindow (nil: no history).
	Rate *Chart
	// State is what the platform is doing, in words (status.Conditions);
	// Use the rate used over the last minute against its pace, its 429s
	// per minute and its fetches in flight fleet-wide.
	State []status.Condition
	Use   status.Usage
}

// overviewPage is the fleet overview.
type overviewPage struct {
	*Base
	Platforms   []PlatformRow
	Workers     []fleet.Worker
	Total       int64 // platforms
	From, To    int64 // positions of the page's first and last platform
	Next        string
	Size        int
	RateWindow  time.Duration
	HistoryNote string // why there is no rate chart, if there is none
}

// readTx runs fn in one read-only repeatable-read transaction, so a page's
// figures agree with each other.
func (h *Handler) readTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := h.cfg.DB.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	return fn(tx)
}

func (h *Handler) overview(ctx context.Context, r *http.Request, b *Base) (view, error) {
	b.Title = "Fleet"
	n, err := h.pageSize(r)
	if err != nil {
		return nil, err
	}
	after := r.URL.Query().Get("after")
	v := &overviewPage{Base: b, Size: n, RateWindow: sparkWindow}
	err = h.readTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, platformsPageSQL, after, n+1)
		if err != nil {
			return err
		}
		platforms, err := pgx.CollectRows(rows, scanPlatform)
		if err != nil {
			return err
		}
		if len(platforms) > n {
			platforms = platforms[:n]
			v.Next = platforms[n-1].Name
		}
		if v.Platforms, err = h.platformRows(ctx, tx, platforms, true); err != nil {
			return err
		}
		if len(platforms) > 0 {
			if err := tx.QueryRow(ctx, platformPositionSQL, platforms[0].Name).Scan(&v.Total, &v.From); err != nil {
				return err
			}
			v.To = v.From + int64(len(platforms)) - 1
		} else if err := tx.QueryRow(ctx, platformPositionSQL, "").Scan(&v.Total, &v.From); err != nil {
			return err
		}
		if v.HistoryNote, err = h.sparklines(ctx, tx, v.Platforms); err != nil {
			return err
		}
		v.Workers, err = fleet.Live(ctx, tx)
		return err
	})
	return v, err
}

// platformRows completes platforms with their pacer state, cooldown and
// (withCounts) their counts.
func (h *Handler) platformRows(ctx context.Context, tx pgx.Tx, platforms []sources.Platform, withCounts bool) ([]PlatformRow, error) {
	out := make([]PlatformRow, len(platforms))
	if len(platforms) == 0 {
		return out, nil
	}
	names := make([]string, len(platforms))
	idx := make(map[string]int, len(platforms))
	for i, p := range platforms {
		names[i], idx[p.Name] = p.Name, i
		out[i].Platform = p
	}
	states, err := pacer.StatesOf(ctx, tx, names)
	if err != nil {
		return nil, err
	}
	for _, s := range states {
		out[idx[s.Platform]].Pace = s
	}
	cooldowns, err := sources.CooldownsOf(ctx, tx, names)
	if err != nil {
		return nil, err
	}
	for i := range cooldowns {
		out[idx[cooldowns[i].Platform]].Cooldown = &cooldowns[i]
	}
	if err := h.states(ctx, tx, out, names, idx); err != nil {
		return nil, err
	}
	if !withCounts {
		return out, nil
	}
	rows, err := tx.Query(ctx, countsOfSQL, names)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			name          string
			c             Counts
			staleMax, p95 float64
		)
		if err := rows.Scan(&name, &c.Due, &c.Queued, &c.Failing, &staleMax, &p95); err != nil {
			return nil, err
		}
		c.StaleMax, c.StaleP95 = seconds(staleMax), seconds(p95)
		out[idx[name]].Counts = c
	}
	return out, rows.Err()
}

// states says what each row's platform is doing (status.Conditions) from
// its pace, cooldown and checks over the last status.RecentWindow, and how
// much of its pace it used, with its fetches in flight in the live
// workers.
func (h *Handler) states(ctx context.Context, tx pgx.Tx, out []PlatformRow, names []string, idx map[string]int) error {
	recent := make([]status.Recent, len(out))
	for i := range recent {
		recent[i] = status.Recent{Window: status.RecentWindow, Checks: map[fetch.Outcome]int64{}}
	}
	rows, err := tx.Query(ctx, recentOfSQL, names, status.RecentWindow.Seconds())
	if err != nil {
		return err
	}
	for rows.Next() {
		var (
			name    string
			outcome fetch.Outcome
			n       int64
		)
		if err := rows.Scan(&name, &outcome, &n); err != nil {
			rows.Close()
			return err
		}
		if i, ok := idx[name]; ok {
			recent[i].Checks[outcome] += n
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	workers, err := fleet.Live(ctx, tx)
	if err != nil {
		return err
	}
	inFlight := status.InFlight(workers)
	for i := range out {
		r := &out[i]
		r.State = status.Conditions(r.Platform, r.Pace, r.Cooldown, recent[i], inFlight[r.Name])
		r.Use = status.UsageOf(r.Pace, recent[i], inFlight[r.Name])
	}
	return nil
}

func seconds(s float64) time.Duration {
	if math.IsNaN(s) || s <= 0 {
		return 0
	}
	return time.Duration(math.Min(s, float64(math.MaxInt64/int64(time.Second))) * float64(time.Second))
}

func scanPlatform(row pgx.CollectableRow) (sources.Platform, error) {
	var p sources.Platform
	var probe, headers, respace bool
	err := row.Scan(&p.Name, &p.RatePerSec, &p.Burst, &p.MaxMultiplier, &p.DecayAfter, &p.Cooldown,
		&p.BackoffFactor, &p.RecoveryFactor, &probe, &headers, &respace)
	p.NoProbe, p.NoUseHeaders, p.NoRespace = !probe, !headers, !respace
	return p, err
}

func scanSourceSummary(row pgx.CollectableRow) (sources.Source, error) {
	var s sources.Source
	err := row.Scan(&s.ID, &s.URL, &s.Enabled, &s.DueAt, &s.LastCheckedAt, &s.ConsecutiveFailures,
		&s.LastStatus, &s.LastOutcome, &s.LastError, &s.QueuedAt, &s.QueuedJobID)
	return s, err
}

// platformPage is one platform.
type platformPage struct {
	*Base
	Row            PlatformRow
	Sources        int64
	Enabled        int64
	Failing        []sources.Source
	FailingNext    string // ?before= of the next page of failing sources
	FailingPaged   bool   // this is not the first page of them
	Overdue        []sources.Source
	Chart          *Chart // requests/s by outcome over ChartWindow
	MultChart      *Chart // the backoff multiplier over ChartWindow (nil: none recorded)
	ChartWindow    time.Duration
	ChartNote      string // why there is no chart, if there is none
	MultiplierNote string
	// Keys is a page of the platform's keys in use or with limits of their
	// own (sources.ListKeys, from ?keys_after=); KeysPaged: not the first.
	Keys      sources.KeyPage
	KeysPaged bool
}

const overdueShown = 10

func (h *Handler) platform(ctx context.Context, r *http.Request, b *Base) (view, error) {
	name := r.PathValue("name")
	b.Title = name
	n, err := h.pageSize(r)
	if err != nil {
		return nil, err
	}
	beforeAt, beforeID, err := parseKeyset(r.URL.Query().Get("before"))
	if err != nil {
		return nil, err
	}
	keysAfter := r.URL.Query().Get("keys_after")
	if err := sources.ValidateKey(keysAfter); err != nil {
		return nil, badf("keys_after must be a key from a next-page link: %v", err)
	}
	v := &platformPage{Base: b, ChartWindow: chartWindow, FailingPaged: r.URL.Query().Has("before"), KeysPaged: keysAfter != ""}
	err = h.readTx(ctx, func(tx pgx.Tx) error {
		p, err := sources.GetPlatform(ctx, tx, name)
		if errors.Is(err, sources.ErrNotFound) {
			return fmt.Errorf("platform %q: %w", name, errNotFound)
		}
		if err != nil {
			return err
		}
		rows, err := h.platformRows(ctx, tx, []sources.Platform{p}, true)
		if err != nil {
			return err
		}
		v.Row = rows[0]
		if err := tx.QueryRow(ctx, sourceTotalsSQL, name).Scan(&v.Sources, &v.Enabled); err != nil {
			return err
		}
		q, err := tx.Query(ctx, failingPageSQL, name, beforeAt, beforeID, n+1)
		if err != nil {
			return err
		}
		if v.Failing, err = pgx.CollectRows(q, scanSourceSummary); err != nil {
			return err
		}
		if len(v.Failing) > n {
			v.Failing = v.Failing[:n]
			last := v.Failing[n-1]
			v.FailingNext = formatKeyset(*last.LastCheckedAt, last.ID)
		}
		q, err = tx.Query(ctx, overdueSQL, name, overdueShown)
		if err != nil {
			return err
		}
		if v.Overdue, err = pgx.CollectRows(q, scanSourceSummary); err != nil {
			return err
		}
		if v.Keys, err = sources.ListKeys(ctx, tx, name, sources.KeyListOptions{After: keysAfter, Limit: min(n, sources.MaxKeyListLimit)}); err != nil {
			return err
		}
		v.Chart, v.MultChart, v.ChartNote, err = h.platformChart(ctx, tx, v.Row)
		return err
	})
	return v, err
}

// parseKeyset reads a failing-sources cursor "unixnano.id"; "" is the
// first page (after everything).
func parseKeyset(s string) (time.Time, int64, error) {
	if s == "" {
		return time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), math.MaxInt64, nil
	}
	at, id, ok := strings.Cut(s, ".")
	ns, err1 := strconv.ParseInt(at, 10, 64)
	n, err2 := strconv.ParseInt(id, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return time.Time{}, 0, badf("before must be a cursor from a next-page link, got %q", s)
	}
	return time.Unix(0, ns), n, nil
}

func formatKeyset(at time.Time, id int64) string {
	return strconv.FormatInt(at.UnixNano(), 10) + "." + strconv.FormatInt(id, 10)
}

// sourcePage is one source: status.ReadSource's report.
type sourcePage struct {
	*Base
	*status.SourceReport
}

func (h *Handler) source(ctx context.Context, r *http.Request, b *Base) (view, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		return nil, badf("source id must be a positive number, got %q", r.PathValue("id"))
	}
	b.Title = fmt.Sprintf("source %d", id)
	rep, err := status.ReadSource(ctx, h.cfg.DB, strconv.FormatInt(id, 10), historyShown)
	if errors.Is(err, sources.ErrNotFound) {
		return nil, fmt.Errorf("source %d: %w", id, errNotFound)
	}
	if err != nil {
		return nil, err
	}
	return &sourcePage{Base: b, SourceReport: rep}, nil
}

// findSource answers the "find a source" forms: ?id= goes to the source,
// ?platform=&url= finds it by URL.
func (h *Handler) findSource(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if id := strings.TrimSpace(q.Get("id")); id != "" {
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil || n < 1 {
			h.fail(w, r, h.base(w, r), http.StatusBadRequest, fmt.Sprintf("source id must be a positive number, got %q", id))
			return
		}
		http.Redirect(w, r, "/sources/"+strconv.FormatInt(n, 10), http.StatusSeeOther)
		return
	}
	platform, u := q.Get("platform"), strings.TrimSpace(q.Get("url"))
	if platform == "" || u == "" {
		h.fail(w, r, h.base(w, r), http.StatusBadRequest, "give a source id, or a platform and a URL")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.QueryTimeout)
	defer cancel()
	var id int64
	err := h.cfg.DB.QueryRow(ctx, sourceByURLSQL, platform, u).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		h.fail(w, r, h.base(w, r), http.StatusNotFound, fmt.Sprintf("platform %q has no source with the URL %q", platform, redact.URL(u)))
	case err != nil && r.Context().Err() != nil:
		h.cfg.Logger.Debug("dashboard: client went away", "path", r.URL.Path, "remote", r.RemoteAddr)
	case dbconn.IsUnavailable(err):
		h.unreachable(w, r, h.base(w, r), "the source was not looked up", err)
	case err != nil:
		h.cfg.Logger.Error("dashboard: finding a source failed", "err", redact.Text(err.Error()))
		h.fail(w, r, h.base(w, r), http.StatusInternalServerError, redact.Text(err.Error()))
	default:
		http.Redirect(w, r, "/sources/"+strconv.FormatInt(id, 10), http.StatusSeeOther)
	}
}

// findPlatform answers the "go to platform" form.
func (h *Handler) findPlatform(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimSpace(r.URL.Query().Get("name"))
	if name == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, "/platforms/"+url.PathEscape(name), http.StatusSeeOther)
}
