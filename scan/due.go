package scan

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/fleetpace/fleetpace/sources"
)

// Due is a source selected by the due query.
type Due struct {
	ID       int64
	Platform string
	URL      string
}

// DueOptions sets the caps of a DueQuery.
type DueOptions struct {
	// Limit is the most sources returned overall. Default: DefaultLimit.
	Limit int
	// Caps is each platform's cap; a platform missing from Caps gets
	// DefaultCap, and a cap ≤ 0 leaves the platform out.
	Caps map[string]int
	// DefaultCap is the cap of platforms not in Caps. Default: Limit.
	DefaultCap int
}

// DueQuery is the tick's due query on its own, with caps given instead of
// worked out from the platforms' rates. It exists for `fleetpace bench
// scan`, which times and explains it apart from the rest of a tick (a tick
// runs the same statements, through the same code), and for the tests;
// nothing in the worker uses it.
type DueQuery struct{ args dueArgs }

// PrepareDue works out the due query's arguments for opts in tx. Like a
// tick, it takes the tick lock (waiting for a tick in progress) and sets
// the tick's planner settings for tx.
func PrepareDue(ctx context.Context, tx pgx.Tx, opts DueOptions) (*DueQuery, error) {
	if _, err := tx.Exec(ctx, tickLockSQL, tickLockKey); err != nil {
		return nil, fmt.Errorf("due: lock: %w", err)
	}
	args, err := optionArgs(ctx, tx, opts)
	if err != nil {
		return nil, err
	}
	return &DueQuery{args: args}, nil
}

// Run runs the due query in the transaction it was prepared in. It returns
// due sources in fair order: never checked first, then longest since
// checked, ties by id; disabled sources, sources already queued and
// platforms cooling down are left out, and every platform is capped in SQL
// before the overall limit, so one platform with a huge backlog cannot fill
// the result and starve the others.
func (q *DueQuery) Run(ctx context.Context, tx pgx.Tx) ([]Due, error) {
	return selectDue(ctx, tx, q.args)
}

// Explain brings the heads up to date and returns the plan of the due
// query's first round as EXPLAIN (ANALYZE, BUFFERS) prints it (the query
// runs).
func (q *DueQuery) Explain(ctx context.Context, tx pgx.Tx) (string, error) {
	if _, err := tx.Exec(ctx, refreshSQL); err != nil {
		return "", fmt.Errorf("due: refresh: %w", err)
	}
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+dueFirstSQL, q.args.limit, q.args.names, q.args.caps)
	if err != nil {
		return "", fmt.Errorf("due: explain: %w", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("due: explain: %w", err)
	}
	return strings.Join(lines, "\n"), nil
}

// dueArgs are the due query's arguments: the overall limit and each
// platform's cap (platforms with a cap ≤ 0 may be left out).
type dueArgs struct {
	limit int
	names []string
	caps  []int32
}

func (a *dueArgs) add(name string, limit int) {
	if limit > 0 {
		a.names = append(a.names, name)
		a.caps = append(a.caps, int32(min(limit, a.limit)))
	}
}

func optionArgs(ctx context.Context, db sources.DBTX, opts DueOptions) (dueArgs, error) {
	if opts.Limit <= 0 {
		opts.Limit = DefaultLimit
	}
	if opts.DefaultCap == 0 {
		opts.DefaultCap = opts.Limit
	}
	rows, err := db.Query(ctx, platformNamesSQL)
	if err != nil {
		return dueArgs{}, fmt.Errorf("due: platforms: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return dueArgs{}, fmt.Errorf("due: platforms: %w", err)
	}
	args := dueArgs{limit: opts.Limit}
	for _, name := range names {
		limit, ok := opts.Caps[name]
		if !ok {
			limit = opts.DefaultCap
		}
		args.add(name, limit)
	}
	return args, nil
}

// dueRow is a due source and its place in fair order.
type dueRow struct {
	Due
	key pgtype.Timestamptz
}

// compareFair orders rows as fair order does: by key (-infinity first), then id.
func compareFair(a, b dueRow) int {
	if c := cmp.Compare(a.key.InfinityModifier, b.key.InfinityModifier); c != 0 || a.key.InfinityModifier != pgtype.Finite {
		return cmp.Or(c, cmp.Compare(a.ID, b.ID))
	}
	return cmp.Or(a.key.Time.Compare(b.key.Time), cmp.Compare(a.ID, b.ID))
}

// stream is what the due query has read of one candidate platform.
type stream struct {
	platform string
	cap      int // the most sources it may give
	rows     []dueRow
	asked    int  // how many the last read asked for
	open     bool // it may have more due sources before the bound
}

// read adds a read's rows and decides whether more may follow: a read that
// came back full and left the platform below its cap.
func (s *stream) read(got []dueRow) {
	s.rows = append(s.rows, got...)
	s.open = len(got) == s.asked && len(s.rows) < s.cap
}

// selectDue runs the due query: it brings the heads up to date
// (refreshSQL), then merges the candidate platforms' due sources in fair
// order, each capped, reading from each only as far as the overall limit
// needs. The first round reads a batch from every candidate
// (dueFirstSQL); as long as a platform that may have more could still place
// a source among the first limit, its next, larger batch is read
// (dueMoreSQL). The caller holds the tick lock.
func selectDue(ctx context.Context, db sources.DBTX, args dueArgs) ([]Due, error) {
	if len(args.names) == 0 {
		return nil, nil
	}
	if _, err := db.Exec(ctx, refreshSQL); err != nil {
		return nil, fmt.Errorf("due: refresh: %w", err)
	}
	streams, bound, err := firstRound(ctx, db, args)
	if err != nil {
		return nil, err
	}
	for {
		top := mergeFair(streams, args.limit)
		var need []*stream
		for _, s := range streams {
			if s.open && (len(top) < args.limit || compareFair(s.rows[len(s.rows)-1], top[len(top)-1]) < 0) {
				need = append(need, s)
			}
		}
		if len(need) == 0 {
			out := make([]Due, len(top))
			for i, r := range top {
				out[i] = r.Due
			}
			return out, nil
		}
		if err := readMore(ctx, db, need, bound); err != nil {
			return nil, err
		}
	}
}

// firstRound runs dueFirstSQL: the candidates, each with its first batch.
func firstRound(ctx context.Context, db sources.DBTX, args dueArgs) ([]*stream, pgtype.Timestamptz, error) {
	var bound pgtype.Timestamptz
	rows, err := db.Query(ctx, dueFirstSQL, args.limit, args.names, args.caps)
	if err != nil {
		return nil, bound, fmt.Errorf("due: %w", err)
	}
	defer rows.Close()
	var (
		streams []*stream
		byName  = map[string]*stream{}
		got     = map[*stream][]dueRow{}
	)
	for rows.Next() {
		var (
			platform    string
			capacity, n int32
			key         pgtype.Timestamptz
			id          *int64
			url         *string
		)
		if err := rows.Scan(&platform, &capacity, &n, &bound, &key, &id, &url); err != nil {
			return nil, bound, fmt.Errorf("due: %w", err)
		}
		s := byName[platform]
		if s == nil {
			s = &stream{platform: platform, cap: int(capacity), asked: int(n)}
			byName[platform] = s
			streams = append(streams, s)
		}
		if id != nil {
			got[s] = append(got[s], dueRow{Due{*id, platform, *url}, key})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, bound, fmt.Errorf("due: %w", err)
	}
	for _, s := range streams {
		slices.SortFunc(got[s], compareFair)
		s.read(got[s])
	}
	return streams, bound, nil
}

// readMore reads the next batch of each stream in need (dueMoreSQL), twice
// what it holds and at least 4, within its cap.
func readMore(ctx context.Context, db sources.DBTX, need []*stream, bound pgtype.Timestamptz) error {
	var (
		names  = make([]string, len(need))
		keys   = make([]pgtype.Timestamptz, len(need))
		ids    = make([]int64, len(need))
		ns     = make([]int32, len(need))
		byName = make(map[string]*stream, len(need))
	)
	for i, s := range need {
		last := s.rows[len(s.rows)-1]
		s.asked = min(s.cap-len(s.rows), max(2*len(s.rows), 4))
		names[i], keys[i], ids[i], ns[i] = s.platform, last.key, last.ID, int32(s.asked)
		byName[s.platform] = s
	}
	rows, err := db.Query(ctx, dueMoreSQL, names, keys, ids, ns, bound)
	if err != nil {
		return fmt.Errorf("due: %w", err)
	}
	got := map[*stream][]dueRow{}
	for rows.Next() {
		var r dueRow
		if err := rows.Scan(&r.Platform, &r.key, &r.ID, &r.URL); err != nil {
			rows.Close()
			return fmt.Errorf("due: %w", err)
		}
		s := byName[r.Platform]
		got[s] = append(got[s], r)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("due: %w", err)
	}
	for _, s := range need {
		slices.SortFunc(got[s], compareFair)
		s.read(got[s])
	}
	return nil
}

// mergeFair returns the first limit rows of all streams in fair order.
func mergeFair(streams []*stream, limit int) []dueRow {
	var all []dueRow
	for _, s := range streams {
		all = append(all, s.rows...)
	}
	slices.SortFunc(all, compareFair)
	return all[:min(limit, len(all))]
}
