package dashboard

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/sources"
)

// The history parts of the pages, from the fetch history (package sources:
// one row per fetch, written with each check), aggregated in SQL over an
// index range per platform or source: the overview's requests/s per
// platform (activityOfSQL: every platform of the page in one statement)
// and the platform page's requests/s by outcome (sources.Activity); the
// source page has its checks from status.ReadSource (sources.History).

// Windows of the history charts and lists.
const (
	sparkWindow  = 15 * time.Minute
	sparkBucket  = 10 * time.Second
	chartWindow  = time.Hour
	chartBucket  = time.Minute
	historyShown = 50
)

// outcomeSeries are the platform chart's series, bottom first: the
// history's outcomes, rate pressure (a 429 or 503) and a rate limit (a
// long Retry-After) together.
var outcomeSeries = []struct {
	label, class string
	outcomes     []fetch.Outcome
}{
	{"ok", "ok", []fetch.Outcome{fetch.OK}},
	{"not modified", "not_modified", []fetch.Outcome{fetch.NotModified}},
	{"429/503", "rate_limited", []fetch.Outcome{fetch.RatePressure, fetch.RateLimited}},
	{"failed", "failed", []fetch.Outcome{fetch.Failed}},
}

// sparklines gives each row its requests/s over the last sparkWindow, in
// sparkBucket buckets, against its ceiling. It returns why there are none,
// if there are none.
func (h *Handler) sparklines(ctx context.Context, tx pgx.Tx, rows []PlatformRow) (string, error) {
	if len(rows) == 0 {
		return "", nil
	}
	names := make([]string, len(rows))
	idx := make(map[string]int, len(rows))
	for i, r := range rows {
		names[i], idx[r.Name] = r.Name, i
	}
	n := int(sparkWindow / sparkBucket)
	perSec := make([][]float64, len(rows))
	for i := range perSec {
		perSec[i] = make([]float64, n)
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
			perSec[i][bucket] += float64(checks) / sparkBucket.Seconds()
		}
	}
	if err := q.Err(); err != nil {
		return "", err
	}
	for i := range rows {
		rows[i].Rate = newChart(chartSpec{Series: []series{{Label: "requests/s", Class: "total", Values: perSec[i]}},
			Bucket: sparkBucket, Window: sparkWindow, Ceiling: rows[i].RatePerSec, Small: true})
	}
	return "", nil
}

// platformChart is a platform's requests/s by outcome over the last
// chartWindow, in chartBucket buckets, with its ceiling; and its backoff
// multiplier over the same window (multChart).
func (h *Handler) platformChart(ctx context.Context, tx pgx.Tx, row PlatformRow) (*Chart, *Chart, string, error) {
	var now time.Time // the transaction's: sources.Activity's buckets start at now − window
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return nil, nil, "", err
	}
	counts, err := sources.Activity(ctx, tx, sources.ActivityQuery{Platform: row.Name, Window: chartWindow, Bucket: chartBucket})
	if err != nil {
		return nil, nil, "", err
	}
	since := now.Add(-chartWindow)
	n := int(chartWindow / chartBucket)
	perSec := map[fetch.Outcome][]float64{}
	for _, s := range outcomeSeries {
		for _, o := range s.outcomes {
			perSec[o] = make([]float64, n)
		}
	}
	for _, c := range counts {
		i := int(c.Start.Sub(since) / chartBucket)
		if v, ok := perSec[c.Outcome]; ok && i >= 0 && i < n {
			v[i] += float64(c.Checks) / chartBucket.Seconds()
		}
	}
	var ss []series
	for _, s := range outcomeSeries {
		sum := make([]float64, n)
		for _, o := range s.outcomes {
			for i, v := range perSec[o] {
				sum[i] += v
			}
		}
		ss = append(ss, series{Label: s.label, Class: s.class, Values: sum})
	}
	c := newChart(chartSpec{Series: ss, Bucket: chartBucket, Window: chartWindow, Ceiling: row.RatePerSec})
	if len(counts) == 0 {
		return c, nil, "no fetch in the last hour", nil
	}
	return c, multChart(counts, since, row.MaxMultiplier), "", nil
}

// multChart is the backoff multiplier over the last chartWindow: in each
// chartBucket the largest multiplier a fetch was paced under, carried
// through buckets without fetches (the multiplier changes only with
// reports), with the platform's maximum as the limit line. Nil when no
// fetch in the window recorded one.
func multChart(counts []sources.ActivityCount, since time.Time, maxMult float64) *Chart {
	n := int(chartWindow / chartBucket)
	vals := make([]float64, n)
	seen := false
	for _, c := range counts {
		if i := int(c.Start.Sub(since) / chartBucket); i >= 0 && i < n && c.MaxMultiplier > 0 {
			vals[i], seen = max(vals[i], c.MaxMultiplier), true
		}
	}
	if !seen {
		return nil
	}
	for i := 1; i < n; i++ {
		if vals[i] == 0 {
			vals[i] = vals[i-1]
		}
	}
	return newChart(chartSpec{Series: []series{{Label: "largest multiplier per minute", Class: "mult", Values: vals}},
		Bucket: chartBucket, Window: chartWindow, Ceiling: maxMult, Quantity: "backoff multiplier",
		Format: multText, CeilingLabel: "at most " + multText(maxMult)})
}
