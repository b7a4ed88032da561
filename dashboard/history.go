package dashboard

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// The history parts of the pages: requests/s per platform and by outcome,
// and a source's checks, from the fetch history (fleetpace_check, one row
// per fetch, written with each check by package sources), aggregated in
// SQL over an index range per platform (fleetpace_check_platform_idx) or
// per source (fleetpace_check_source_idx).

// Windows of the history charts and lists.
const (
	sparkWindow  = 15 * time.Minute
	sparkBucket  = 30 * time.Second
	chartWindow  = time.Hour
	chartBucket  = time.Minute
	historyShown = 50
)

// outcomeSeries are the platform chart's series, bottom first: the
// history's outcomes, rate pressure (a 429 or 503) and a rate limit (a
// long Retry-After) together.
var outcomeSeries = []struct {
	label, class string
	outcomes     []string
}{
	{"ok", "ok", []string{"ok"}},
	{"not modified", "not_modified", []string{"not_modified"}},
	{"429/503", "rate_limited", []string{"rate_pressure", "rate_limited"}},
	{"failed", "failed", []string{"failed"}},
}

// Check is one fetch of a source, from the history.
type Check struct {
	At       time.Time
	Outcome  string
	Status   int // HTTP status, 0 if none
	Duration time.Duration
	Bytes    int64
	Reason   string
	Worker   string
}

// noHistory is why a database has no history to show: its schema predates
// the history table.
const noHistory = "this database has no fetch history (its schema predates it: run `fleetpace schema apply`)"

// hasHistory reports whether the database has the history table.
func hasHistory(ctx context.Context, tx pgx.Tx) (bool, error) {
	var ok bool
	err := tx.QueryRow(ctx, hasHistorySQL).Scan(&ok)
	return ok, err
}

// sparklines gives each row its requests/s over the last sparkWindow, in
// sparkBucket buckets, against its ceiling. It returns why there are none,
// if there are none.
func (h *Handler) sparklines(ctx context.Context, tx pgx.Tx, rows []PlatformRow) (string, error) {
	if len(rows) == 0 {
		return "", nil
	}
	if ok, err := hasHistory(ctx, tx); err != nil || !ok {
		return noHistory, err
	}
	names := make([]string, len(rows))
	idx := make(map[string]int, len(rows))
	for i, r := range rows {
		names[i], idx[r.Name] = r.Name, i
	}
	n := int(sparkWindow / sparkBucket)
	counts := make([][]float64, len(rows))
	for i := range counts {
		counts[i] = make([]float64, n)
	}
	q, err := tx.Query(ctx, activityOfSQL, names, sparkWindow.Seconds(), sparkBucket.Seconds())
	if err != nil {
		return "", err
	}
	defer q.Close()
	for q.Next() {
		var (
			name   string
			bucket int
			checks int64
		)
		if err := q.Scan(&name, &bucket, &checks); err != nil {
			return "", err
		}
		if i, ok := idx[name]; ok && bucket >= 0 && bucket < n {
			counts[i][bucket] += float64(checks) / sparkBucket.Seconds()
		}
	}
	if err := q.Err(); err != nil {
		return "", err
	}
	for i := range rows {
		rows[i].Rate = newChart(chartSpec{Series: []series{{Label: "requests/s", Class: "total", Values: counts[i]}},
			Bucket: sparkBucket, Window: sparkWindow, Ceiling: rows[i].RatePerSec, Small: true})
	}
	return "", nil
}

// platformChart is a platform's requests/s by outcome over the last
// chartWindow, in chartBucket buckets, with its ceiling.
func (h *Handler) platformChart(ctx context.Context, tx pgx.Tx, row PlatformRow) (*Chart, string, error) {
	if ok, err := hasHistory(ctx, tx); err != nil || !ok {
		return nil, noHistory, err
	}
	q, err := tx.Query(ctx, activityByOutcomeSQL, row.Name, chartWindow.Seconds(), chartBucket.Seconds())
	if err != nil {
		return nil, "", err
	}
	defer q.Close()
	n := int(chartWindow / chartBucket)
	values := map[string][]float64{}
	for _, s := range outcomeSeries {
		for _, o := range s.outcomes {
			values[o] = make([]float64, n)
		}
	}
	any := false
	for q.Next() {
		var (
			bucket  int
			outcome string
			checks  int64
		)
		if err := q.Scan(&bucket, &outcome, &checks); err != nil {
			return nil, "", err
		}
		if v, ok := values[outcome]; ok && bucket >= 0 && bucket < n {
			v[bucket] += float64(checks) / chartBucket.Seconds()
			any = true
		}
	}
	if err := q.Err(); err != nil {
		return nil, "", err
	}
	var ss []series
	for _, s := range outcomeSeries {
		sum := make([]float64, n)
		for _, o := range s.outcomes {
			for i, v := range values[o] {
				sum[i] += v
			}
		}
		ss = append(ss, series{Label: s.label, Class: s.class, Values: sum})
	}
	c := newChart(chartSpec{Series: ss, Bucket: chartBucket, Window: chartWindow, Ceiling: row.RatePerSec})
	if !any {
		return c, "no fetch in the last hour", nil
	}
	return c, "", nil
}

// sourceHistory is a source's last n checks, newest first.
func (h *Handler) sourceHistory(ctx context.Context, tx pgx.Tx, id int64, n int) ([]Check, string, error) {
	if ok, err := hasHistory(ctx, tx); err != nil || !ok {
		return nil, noHistory, err
	}
	rows, err := tx.Query(ctx, sourceHistorySQL, id, n)
	if err != nil {
		return nil, "", err
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Check, error) {
		var (
			c      Check
			status *int16
			ms     float32
			reason *string
		)
		err := row.Scan(&c.At, &c.Outcome, &status, &ms, &c.Bytes, &reason, &c.Worker)
		if status != nil {
			c.Status = int(*status)
		}
		if reason != nil {
			c.Reason = *reason
		}
		c.Duration = time.Duration(float64(ms) * float64(time.Millisecond))
		return c, err
	})
	return out, "", err
}
