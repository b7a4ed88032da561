package scan

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/fleetpace/fleetpace/sources"
)

// Due is a source selected by the due query.
type Due struct {
	ID       int64
	Platform string
	Key      string
}

// KeyRef names a key of a platform.
type KeyRef struct{ Platform, Key string }

// DueOptions sets the caps of a DueQuery.
type DueOptions struct {
	// Limit is the most sources returned overall. Default: DefaultLimit.
	Limit int
	// Caps is each platform's cap; a platform missing from Caps gets
	// DefaultCap, and a cap ≤ 0 leaves the platform out.
	Caps map[string]int
	// DefaultCap is the cap of platforms not in Caps. Default: Limit.
	DefaultCap int
	// KeyCaps caps single keys within their platform's cap (in a tick: the
	// key's rate × look-ahead minus its queued jobs); a cap ≤ 0 leaves the
	// key out. Key "" — sources without a key, the platform's own — is
	// never capped apart from its platform.
	KeyCaps map[KeyRef]int
	// KeyCap is, per platform, the cap of its keys missing from KeyCaps; a
	// platform missing from it has no per-key cap.
	KeyCap map[string]int
}

// DueQuery is the tick's due query on its own, with caps given instead of
// worked out from the platforms' rates. It exists for `fleetpace bench
// scan`, which times and explains it apart from the rest of a tick (a tick
// runs the same statements, through the same code), and for the tests;
// nothing in the worker uses it.
type DueQuery struct {
	args  dueArgs
	stats DueStats
}

// DueStats tells what the last run of a DueQuery read.
type DueStats struct {
	Statements int `json:"statements"` // statements run (the refresh included)
	Candidates int `json:"candidates"` // platforms read in the order of their heads
	Keys       int `json:"keys"`       // keys' heads read
	Sources    int `json:"sources"`    // due sources read past keys' heads
}

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
// due sources: disabled sources, sources already queued and platforms
// cooling down or paused are left out; every platform is capped at its cap
// and every key at its own, and within a platform keys take turns, so
// neither a platform nor a key with a huge backlog can fill the result and
// starve the others. The order is fair order across platforms (see
// selectDue).
func (q *DueQuery) Run(ctx context.Context, tx pgx.Tx) ([]Due, error) {
	q.stats = DueStats{}
	return selectDue(ctx, tx, q.args, &q.stats)
}

// Stats tells what the last Run read.
func (q *DueQuery) Stats() DueStats { return q.stats }

// Explain brings the heads up to date and returns the plans of the due
// query's statements as EXPLAIN (ANALYZE, BUFFERS) prints them (they run):
// the refresh of the heads, the candidates and the first round of reads.
func (q *DueQuery) Explain(ctx context.Context, tx pgx.Tx) (string, error) {
	var out []string
	explain := func(name, sql string, args ...any) error {
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
		if err != nil {
			return fmt.Errorf("due: explain %s: %w", name, err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("due: explain %s: %w", name, err)
		}
		out = append(out, name+":", strings.Join(lines, "\n"))
		return nil
	}
	if err := explain("refresh", refreshSQL); err != nil {
		return "", err
	}
	if len(q.args.names) == 0 {
		return strings.Join(out, "\n"), nil
	}
	r := newDueRun(q.args)
	heads := []any{q.args.out, r.candAfter.fair.timestamptz(), r.candAfter.ID, q.args.limit}
	if err := explain("candidates", platformHeadsSQL, heads...); err != nil {
		return "", err
	}
	if err := r.candidates(ctx, tx); err != nil {
		return "", err
	}
	if err := explain("first reads", dueReadSQL, r.readArgs()...); err != nil {
		return "", err
	}
	return strings.Join(out, "\n"), nil
}

// dueArgs are the due query's arguments: the overall limit, each platform's
// cap (platforms with a cap ≤ 0 are left out) and the keys' caps.
type dueArgs struct {
	limit  int
	names  []string       // the platforms taking part, in name order
	caps   map[string]int // their caps, at most limit
	out    []string       // the platforms known to take no part
	keyCap map[string]int // per platform, the cap of keys not in keyCaps
	keys   map[KeyRef]int // single keys' caps
}

func newDueArgs(limit int) dueArgs {
	return dueArgs{limit: limit, caps: map[string]int{}, keyCap: map[string]int{}, keys: map[KeyRef]int{}}
}

func (a *dueArgs) add(name string, limit int) {
	if limit > 0 {
		a.names = append(a.names, name)
		a.caps[name] = min(limit, a.limit)
	} else {
		a.out = append(a.out, name)
	}
}

// capOf is the most sources key k of platform p may give: its platform's
// cap, lowered by the key's own.
func (a *dueArgs) capOf(p, k string) int {
	c := a.caps[p]
	if k == "" {
		return c
	}
	if v, ok := a.keys[KeyRef{p, k}]; ok {
		return min(c, v)
	}
	if v, ok := a.keyCap[p]; ok {
		return min(c, v)
	}
	return c
}

// spentKeys are the keys of platforms taking part whose own cap is spent
// (explicit caps ≤ 0): the key walks leave them out in SQL, so a platform
// whose many keys are all busy costs no reading of them.
func (a *dueArgs) spentKeys() (platforms, keys []string) {
	platforms, keys = []string{}, []string{}
	for r, c := range a.keys {
		if c <= 0 && r.Key != "" && a.caps[r.Platform] > 0 {
			platforms, keys = append(platforms, r.Platform), append(keys, r.Key)
		}
	}
	return platforms, keys
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
	type platform struct {
		name    string
		stopped bool
	}
	var platforms []platform
	for rows.Next() {
		var p platform
		if err := rows.Scan(&p.name, &p.stopped); err != nil {
			rows.Close()
			return dueArgs{}, fmt.Errorf("due: platforms: %w", err)
		}
		platforms = append(platforms, p)
	}
	if err := rows.Err(); err != nil {
		return dueArgs{}, fmt.Errorf("due: platforms: %w", err)
	}
	args := newDueArgs(opts.Limit)
	for _, p := range platforms {
		limit, ok := opts.Caps[p.name]
		if !ok {
			limit = opts.DefaultCap
		}
		if p.stopped {
			limit = 0
		}
		args.add(p.name, limit)
	}
	for p, c := range opts.KeyCap {
		args.keyCap[p] = c
	}
	for r, c := range opts.KeyCaps {
		args.keys[r] = c
	}
	return args, nil
}

// dueRow is a due source and its place in fair order.
type dueRow struct {
	Due
	fair fairPlace
}

// fairPlace is a fair key (a timestamptz) as PostgreSQL keeps it:
// microseconds since 2000-01-01 UTC, -infinity and infinity the least and
// the greatest int64. Every timestamptz fits, and rows compare as integers
// (the due query sorts thousands of them each round).
type fairPlace int64

// pgEpoch is 2000-01-01 UTC in Unix seconds.
const pgEpoch = 946_684_800

func fairOf(t pgtype.Timestamptz) fairPlace {
	switch t.InfinityModifier {
	case pgtype.NegativeInfinity:
		return math.MinInt64
	case pgtype.Infinity:
		return math.MaxInt64
	}
	return fairPlace((t.Time.Unix()-pgEpoch)*1_000_000 + int64(t.Time.Nanosecond()/1000))
}

// timestamptz is k as an argument of a statement.
func (k fairPlace) timestamptz() pgtype.Timestamptz {
	switch k {
	case math.MinInt64:
		return pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	case math.MaxInt64:
		return pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
	}
	sec, us := int64(k)/1_000_000, int64(k)%1_000_000
	if us < 0 {
		sec, us = sec-1, us+1_000_000
	}
	return pgtype.Timestamptz{Time: time.Unix(sec+pgEpoch, us*1000).UTC(), Valid: true}
}

// compareFair orders rows as fair order does: by fair key (-infinity
// first), then id.
func compareFair(a, b dueRow) int {
	return cmp.Or(cmp.Compare(a.fair, b.fair), cmp.Compare(a.ID, b.ID))
}

// after is the least place strictly after r: every row after r is at or
// after it (ids are integers).
func after(r dueRow) dueRow {
	r.ID++
	return r
}

// keyStream is what the due query has read of one key of a candidate
// platform: its head (from fleetpace_platform_due) and the due sources
// after it, in fair order.
type keyStream struct {
	key  string
	cap  int      // the most sources it may give
	rows []dueRow // rows[0] is the head
	open bool     // more due sources may follow rows[len(rows)-1]
	want int      // how many more the next round reads
}

// got adds a walk's rows, asked asked for, and trims the key to its cap.
func (k *keyStream) got(rows []dueRow, asked int) {
	k.rows = append(k.rows, rows...)
	k.open = len(rows) == asked
	if len(k.rows) >= k.cap {
		k.rows, k.open = k.rows[:k.cap], false
	}
}

// platformStream is what the due query has read of one candidate platform,
// and what that tells of its turn order.
//
// Within a platform keys take turns: its sources in turn order are the first
// due source of every key (its head), in fair order, then the second of
// every key, and so on, each key up to its cap; the platform gives the
// first cap of them (its selection). turn is the prefix of that order known
// from what was read; low is the least place any source of the selection
// outside turn can have (nil: none can be outside).
type platformStream struct {
	name     string
	cap      int
	keys     []*keyStream // in head order, those with a cap > 0
	keysRead int          // key rows read, those left out included
	lastKey  dueRow       // the place of the last key row read
	keysOpen bool         // more keys may follow
	wantKeys int          // how many keys the next round reads (0: none)
	wantSrc  int          // and how many sources it asks of them, if that is all its keys
	turn     []dueRow
	low      *dueRow
}

// dueRun is one run of the due query: the candidates read so far and where
// the walk of platforms' heads stands.
type dueRun struct {
	args      dueArgs
	platforms []*platformStream
	byName    map[string]*platformStream
	candAfter dueRow // the place after which the next candidates come
	candOpen  bool   // more candidates may follow
	candRead  int    // candidates read
	stats     *DueStats
	all       []place // decide's merge, kept from one round to the next
}

// first is a place before every source: walks start after it.
var first = dueRow{Due: Due{ID: math.MinInt64}, fair: math.MinInt64}

func newDueRun(args dueArgs) *dueRun {
	return &dueRun{
		args:      args,
		byName:    map[string]*platformStream{},
		candAfter: first,
		candOpen:  true,
		stats:     &DueStats{},
	}
}

// selectDue runs the due query: it brings the heads up to date, then reads
// the candidate platforms — those whose heads come first — and from each
// its keys in the order of their heads and its keys' due sources, as far
// as the overall limit needs, in rounds (one statement each, every
// platform and key that needs more at once), and merges in Go.
//
// The result is the first limit sources, in fair order, of the union of
// every platform's selection (its first cap sources in turn order, see
// platformStream), with each platform's places in it taken by its sources
// in turn order: a platform gets as many places as fair order gives its
// selection, and its keys take turns filling them. With one key per
// platform this is plain fair order, every platform capped. A platform's
// sources outside what was read come after its low, and every source of a
// platform not read yet after the last candidate's head; the rounds end
// when none of those can come among the first limit. The caller holds the
// tick lock.
func selectDue(ctx context.Context, db sources.DBTX, args dueArgs, stats *DueStats) ([]Due, error) {
	if len(args.names) == 0 {
		return nil, nil
	}
	if err := refresh(ctx, db); err != nil {
		return nil, err
	}
	stats.Statements++
	r := newDueRun(args)
	r.stats = stats
	if err := r.candidates(ctx, db); err != nil {
		return nil, err
	}
	for {
		if err := r.read(ctx, db); err != nil {
			return nil, err
		}
		top, more := r.decide()
		if more {
			if err := r.candidates(ctx, db); err != nil {
				return nil, err
			}
			continue
		}
		if !r.pending() {
			return r.result(top), nil
		}
	}
}

// analyzeAfter is how many keys' rows a refresh adds or removes, at least,
// before it analyzes fleetpace_platform_due: that many, and a tenth of
// the rows the planner counts.
const analyzeAfter = 1000

// refresh brings the heads up to date (refreshSQL), and the planner's
// statistics of them after a large change (analyzeDueSQL).
func refresh(ctx context.Context, db sources.DBTX) error {
	var (
		changed int64
		tuples  float64
	)
	if err := db.QueryRow(ctx, refreshSQL).Scan(&changed, &tuples); err != nil {
		return fmt.Errorf("due: refresh: %w", err)
	}
	if changed >= analyzeAfter && float64(changed) > tuples/10 {
		if _, err := db.Exec(ctx, analyzeDueSQL); err != nil {
			return fmt.Errorf("due: analyze: %w", err)
		}
	}
	return nil
}

// firstKeys is how many keys a candidate's first read asks for, at least.
const firstKeys = 8

// candidates reads the next platforms in the order of their heads: as many
// as the limit (each gives at least its first source, so the limit's worth
// of them bounds where the first limit sources can be), and schedules each
// one's first read: a batch of its keys, its share of twice the limit.
func (r *dueRun) candidates(ctx context.Context, db sources.DBTX) error {
	rows, err := db.Query(ctx, platformHeadsSQL, r.args.out, r.candAfter.fair.timestamptz(), r.candAfter.ID, r.args.limit)
	if err != nil {
		return fmt.Errorf("due: candidates: %w", err)
	}
	var fresh []*platformStream
	n := 0
	for rows.Next() {
		var (
			head dueRow
			fair pgtype.Timestamptz
		)
		if err := rows.Scan(&head.Platform, &fair, &head.ID); err != nil {
			rows.Close()
			return fmt.Errorf("due: candidates: %w", err)
		}
		head.fair = fairOf(fair)
		n++
		r.candAfter = head
		if _, seen := r.byName[head.Platform]; seen || r.args.caps[head.Platform] <= 0 {
			continue
		}
		p := &platformStream{
			name:     head.Platform,
			cap:      r.args.caps[head.Platform],
			lastKey:  first,
			keysOpen: true,
		}
		r.byName[p.name] = p
		r.platforms = append(r.platforms, p)
		fresh = append(fresh, p)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("due: candidates: %w", err)
	}
	r.candOpen = n == r.args.limit
	r.candRead += n
	r.stats.Statements++
	r.stats.Candidates += n
	batch := max(2, (2*r.args.limit+r.candRead-1)/max(r.candRead, 1))
	for _, p := range fresh {
		// A platform of one key costs the same whatever the keys asked
		// for; one of a few keys gets them all at once.
		p.wantKeys, p.wantSrc = min(p.cap, max(batch, firstKeys)), min(p.cap, batch)
	}
	return nil
}

// pending reports whether a read is scheduled.
func (r *dueRun) pending() bool {
	for _, p := range r.platforms {
		if p.wantKeys > 0 {
			return true
		}
		for _, k := range p.keys {
			if k.want > 0 {
				return true
			}
		}
	}
	return false
}

// readArgs are dueReadSQL's arguments for the reads scheduled.
func (r *dueRun) readArgs() []any {
	var (
		kp          = []string{}
		kk          = []pgtype.Timestamptz{}
		kid         = []int64{}
		kn, ks      = []int32{}, []int32{}
		wp, wk      = []string{}, []string{}
		wf          = []pgtype.Timestamptz{}
		wid         = []int64{}
		wn          = []int32{}
		spentP, spK = r.args.spentKeys()
	)
	for _, p := range r.platforms {
		if p.wantKeys > 0 {
			kp, kk, kid = append(kp, p.name), append(kk, p.lastKey.fair.timestamptz()), append(kid, p.lastKey.ID)
			kn, ks = append(kn, int32(p.wantKeys)), append(ks, int32(p.wantSrc))
		}
		for _, k := range p.keys {
			if k.want > 0 {
				last := k.rows[len(k.rows)-1]
				wp, wk, wf, wid, wn = append(wp, p.name), append(wk, k.key), append(wf, last.fair.timestamptz()), append(wid, last.ID), append(wn, int32(k.want))
			}
		}
	}
	return []any{kp, kk, kid, kn, ks, spentP, spK, wp, wk, wf, wid, wn}
}

// read runs the reads scheduled (dueReadSQL, one statement) and adds what
// they brought to the streams.
func (r *dueRun) read(ctx context.Context, db sources.DBTX) error {
	if !r.pending() {
		return nil
	}
	rows, err := db.Query(ctx, dueReadSQL, r.readArgs()...)
	if err != nil {
		return fmt.Errorf("due: %w", err)
	}
	r.stats.Statements++
	type keyRows struct {
		p    *platformStream
		key  string
		head *dueRow
		rows []dueRow
	}
	var (
		order []*keyRows // key rows (heads) in the order read, then walks
		byKey = map[KeyRef]*keyRows{}
	)
	for rows.Next() {
		var (
			isHead bool
			row    dueRow
			fair   pgtype.Timestamptz
		)
		if err := rows.Scan(&isHead, &row.Platform, &row.Key, &fair, &row.ID); err != nil {
			rows.Close()
			return fmt.Errorf("due: %w", err)
		}
		row.fair = fairOf(fair)
		ref := KeyRef{row.Platform, row.Key}
		kr := byKey[ref]
		if kr == nil {
			kr = &keyRows{p: r.byName[row.Platform], key: row.Key}
			byKey[ref] = kr
			order = append(order, kr)
		}
		if isHead {
			h := row
			kr.head = &h
			r.stats.Keys++
		} else {
			r.stats.Sources++
			kr.rows = append(kr.rows, row)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("due: %w", err)
	}

	// Keys read, per platform, in head order.
	heads := map[*platformStream][]*keyRows{}
	for _, kr := range order {
		if kr.head != nil {
			heads[kr.p] = append(heads[kr.p], kr)
		}
	}
	for _, p := range r.platforms {
		if p.wantKeys == 0 {
			continue
		}
		asked, got := p.wantKeys, heads[p]
		slices.SortFunc(got, func(a, b *keyRows) int { return compareFair(*a.head, *b.head) })
		p.keysRead += len(got)
		p.keysOpen = len(got) == asked
		// Each key read was walked on by ceil(sources / keys) − 1 when the
		// platform had fewer keys than asked for.
		depth := 0
		if len(got) > 0 && len(got) < asked {
			depth = (p.wantSrc+len(got)-1)/len(got) - 1
		}
		p.wantKeys, p.wantSrc = 0, 0
		for _, kr := range got {
			p.lastKey = *kr.head
			k := &keyStream{key: kr.key, cap: r.args.capOf(p.name, kr.key), rows: []dueRow{*kr.head}}
			if k.cap <= 0 {
				continue
			}
			if depth > 0 {
				slices.SortFunc(kr.rows, compareFair)
				k.got(kr.rows, depth)
			} else {
				k.open = k.cap > 1
			}
			p.keys = append(p.keys, k)
		}
	}
	// Walks of single keys.
	for _, p := range r.platforms {
		for _, k := range p.keys {
			if k.want == 0 {
				continue
			}
			var got []dueRow
			if kr := byKey[KeyRef{p.name, k.key}]; kr != nil && kr.head == nil {
				got = kr.rows
			}
			slices.SortFunc(got, compareFair)
			asked := k.want
			k.want = 0
			k.got(got, asked)
		}
	}
	return nil
}

// decide merges what was read: it returns the first limit sources known in
// fair order, schedules the next read of every platform that may still
// place a source among them, and reports whether more candidates are
// needed (the platforms not read yet may).
func (r *dueRun) decide() (top []place, moreCandidates bool) {
	all := r.all[:0]
	for i, p := range r.platforms {
		p.turnOrder()
		for _, row := range p.turn {
			all = append(all, place{fair: row.fair, id: row.ID, p: i})
		}
	}
	r.all = all
	slices.SortFunc(all, func(a, b place) int { return cmp.Or(cmp.Compare(a.fair, b.fair), cmp.Compare(a.id, b.id)) })
	top = all[:min(r.args.limit, len(all))]
	before := func(low dueRow) bool {
		if len(top) < r.args.limit {
			return true
		}
		last := top[len(top)-1]
		return cmp.Or(cmp.Compare(low.fair, last.fair), cmp.Compare(low.ID, last.id)) < 0
	}
	for _, p := range r.platforms {
		if p.low != nil && before(*p.low) {
			p.schedule()
		}
	}
	return top, r.candOpen && before(after(r.candAfter))
}

// result gives each platform's places in top to its sources in turn order.
func (r *dueRun) result(top []place) []Due {
	taken := make([]int, len(r.platforms))
	out := make([]Due, len(top))
	for i, pl := range top {
		p := r.platforms[pl.p]
		out[i] = p.turn[taken[pl.p]].Due
		taken[pl.p]++
	}
	return out
}

// place is a source's place in the merge: its fair key and id, and its
// platform (an index of dueRun.platforms). It holds no pointer, so
// sorting thousands of them moves no pointer (no write barriers).
type place struct {
	fair fairPlace
	id   int64
	p    int
}
