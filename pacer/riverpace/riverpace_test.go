package riverpace_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/fleetpace/fleetpace/internal/pacetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/pacer/riverpace"
	"github.com/fleetpace/fleetpace/sources"
)

// countingMiddleware counts the jobs it sees: another middleware to
// compose with.
type countingMiddleware struct {
	river.MiddlewareDefaults
	n atomic.Int64
}

func (m *countingMiddleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	m.n.Add(1)
	return doInner(ctx)
}

// countingPacer counts the slots asked of a Pacer (one Acquire per paced
// job, however often it gave a slot up late and reserved again inside).
type countingPacer struct {
	riverpace.Pacer
	asked atomic.Int64
}

func (c *countingPacer) Acquire(ctx context.Context, platform string, maxWait time.Duration) (pacer.Reservation, error) {
	c.asked.Add(1)
	return c.Pacer.Acquire(ctx, platform, maxWait)
}

// taskArgs is a job kind whose outcome the test decides.
type taskArgs struct {
	Platform string `json:"platform"`
}

func (taskArgs) Kind() string { return "riverpace_task" }

// taskWorker runs do (nil: succeed) and counts its runs.
type taskWorker struct {
	river.WorkerDefaults[taskArgs]
	do   func(ctx context.Context, job *river.Job[taskArgs]) error
	runs atomic.Int64
}

func (w *taskWorker) Work(ctx context.Context, job *river.Job[taskArgs]) error {
	w.runs.Add(1)
	if w.do == nil {
		return nil
	}
	return w.do(ctx, job)
}

// otherArgs is a second kind, worked by otherWorker, which carries a
// middleware of its own.
type otherArgs struct{}

func (otherArgs) Kind() string { return "riverpace_other" }

type otherWorker struct {
	river.WorkerDefaults[otherArgs]
	mw   rivertype.WorkerMiddleware
	runs atomic.Int64
}

func (w *otherWorker) Middleware(*rivertype.JobRow) []rivertype.WorkerMiddleware {
	if w.mw == nil {
		return nil
	}
	return []rivertype.WorkerMiddleware{w.mw}
}

func (w *otherWorker) Work(ctx context.Context, job *river.Job[otherArgs]) error {
	w.runs.Add(1)
	return nil
}

// env is one test's database, pacer and River client.
type env struct {
	url   string
	pool  *pgxpool.Pool
	pacer *pacer.Pacer
}

func newEnv(t *testing.T) *env {
	t.Helper()
	url := testdb.URL(t)
	p, err := pacer.New(context.Background(), pacer.Config{DatabaseURL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return &env{url: url, pool: newPool(t, url), pacer: p}
}

func (e *env) platform(t *testing.T, name string, ratePerSec float64) {
	t.Helper()
	if _, err := sources.SetPlatform(context.Background(), e.pool, sources.Platform{Name: name, RatePerSec: ratePerSec}); err != nil {
		t.Fatal(err)
	}
}

// start starts a River client with the given middleware and workers,
// stopped when the test ends.
func (e *env) start(t *testing.T, mws []rivertype.Middleware, ws *river.Workers) *river.Client[pgx.Tx] {
	t.Helper()
	client, err := river.NewClient(riverpgxv5.New(e.pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers:           ws,
		Middleware:        mws,
		FetchCooldown:     10 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := client.StopAndCancel(ctx); err != nil {
			t.Error(err)
		}
	})
	return client
}

func (e *env) middleware(t *testing.T, mod func(*riverpace.Config)) *riverpace.Middleware {
	t.Helper()
	cfg := riverpace.Config{Pacer: e.pacer, Platform: riverpace.ArgsField("platform")}
	if mod != nil {
		mod(&cfg)
	}
	mw, err := riverpace.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// insertTasks inserts one taskArgs job per platform given.
func insertTasks(t *testing.T, client *river.Client[pgx.Tx], opts *river.InsertOpts, platforms ...string) []int64 {
	t.Helper()
	params := make([]river.InsertManyParams, len(platforms))
	for i, p := range platforms {
		params[i] = river.InsertManyParams{Args: taskArgs{Platform: p}, InsertOpts: opts}
	}
	return insert(t, client, params)
}

// waitState polls the jobs until every one is in state.
func waitState(t *testing.T, client *river.Client[pgx.Tx], state rivertype.JobState, ids ...int64) []*rivertype.JobRow {
	t.Helper()
	rows := make([]*rivertype.JobRow, len(ids))
	pacetest.Poll(t, time.Minute, "jobs "+string(state), func() bool {
		for i, id := range ids {
			row, err := client.JobGet(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			rows[i] = row
			if row.State != state {
				return false
			}
		}
		return true
	})
	return rows
}

func snoozes(row *rivertype.JobRow) int {
	var m struct {
		Snoozes int `json:"snoozes"`
	}
	_ = json.Unmarshal(row.Metadata, &m)
	return m.Snoozes
}

// Jobs snoozed by the middleware (their slot is further away than MaxWait)
// keep their attempt count: while snoozed it is back at 0, and each
// completes on attempt 1 with no error recorded.
func TestSnoozedJobsKeepTheirAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.platform(t, "slow", 1) // one job a second
	w := &taskWorker{}
	ws := river.NewWorkers()
	river.AddWorker(ws, w)
	client := e.start(t, []rivertype.Middleware{e.middleware(t, func(c *riverpace.Config) { c.MaxWait = 100 * time.Millisecond })}, ws)
	ids := insertTasks(t, client, &river.InsertOpts{MaxAttempts: 2}, "slow", "slow", "slow")

	// Catch a job while it is snoozed.
	pacetest.Poll(t, time.Minute, "a snoozed job", func() bool {
		for _, id := range ids {
			row, err := client.JobGet(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if snoozes(row) > 0 && (row.State == rivertype.JobStateScheduled || row.State == rivertype.JobStateAvailable) {
				if row.Attempt != 0 || len(row.Errors) != 0 {
					t.Fatalf("snoozed job %d: attempt %d, errors %v; want attempt 0 and no error", row.ID, row.Attempt, row.Errors)
				}
				return true
			}
		}
		return false
	})

	rows := waitState(t, client, rivertype.JobStateCompleted, ids...)
	total := 0
	for _, row := range rows {
		if row.Attempt != 1 || row.MaxAttempts != 2 || len(row.Errors) != 0 {
			t.Fatalf("job %d: attempt %d of %d, errors %v; want attempt 1 of 2 and no error", row.ID, row.Attempt, row.MaxAttempts, row.Errors)
		}
		total += snoozes(row)
	}
	if total < 2 || w.runs.Load() != 3 {
		t.Fatalf("%d snoozes, %d runs: want at least 2 snoozes (3 jobs at 1/s, 100 ms max wait) and each job run once", total, w.runs.Load())
	}
	t.Logf("3 jobs, %d snoozes, every job completed on attempt 1", total)
}

// A job interrupted while it waits for its slot (the client stops) never
// ran: River puts it back without using up an attempt, because the
// middleware's error still says context.Canceled.
func TestInterruptedWhileWaitingUsesNoAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.platform(t, "rare", 0.1) // one job every 10 s
	w := &taskWorker{}
	ws := river.NewWorkers()
	river.AddWorker(ws, w)
	client := e.start(t, []rivertype.Middleware{e.middleware(t, func(c *riverpace.Config) { c.MaxWait = time.Minute })}, ws)
	ids := insertTasks(t, client, nil, "rare", "rare")
	pacetest.Poll(t, time.Minute, "both jobs holding slots", func() bool { return e.pacer.Stats().Granted >= 2 })
	pacetest.Poll(t, time.Minute, "the first job's run", func() bool { return w.runs.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := client.StopAndCancel(ctx); err != nil {
		t.Fatal(err)
	}
	waiting := 0
	for _, id := range ids {
		row, err := client.JobGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if row.State == rivertype.JobStateCompleted {
			continue
		}
		waiting++
		if row.State != rivertype.JobStateAvailable || row.Attempt != 0 || len(row.Errors) != 0 {
			t.Fatalf("job interrupted while waiting: state %s, attempt %d, errors %v; want available, attempt 0, no error",
				row.State, row.Attempt, row.Errors)
		}
	}
	if waiting != 1 || w.runs.Load() != 1 {
		t.Fatalf("%d jobs left waiting, %d runs; want 1 and 1", waiting, w.runs.Load())
	}
}

// A job returning RateLimited is reported as pressure (the multiplier
// rises, Retry-After holds the platform fleet-wide) and is snoozed,
// using up no attempt; a job returning another error is neutral and goes
// back to River as it is.
func TestRateLimitedIsPressureOtherErrorsNeutral(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.platform(t, "api", 50)
	w := &taskWorker{do: func(ctx context.Context, job *river.Job[taskArgs]) error {
		if job.Metadata != nil && strings.Contains(string(job.Metadata), `"snoozes"`) {
			return nil // the second run succeeds
		}
		return riverpace.RateLimited(2 * time.Second)
	}}
	ws := river.NewWorkers()
	river.AddWorker(ws, w)
	client := e.start(t, []rivertype.Middleware{e.middleware(t, nil)}, ws)
	id := insertTasks(t, client, &river.InsertOpts{MaxAttempts: 1}, "api")[0]

	var st pacer.State
	pacetest.Poll(t, time.Minute, "the rate-limited run's report", func() bool {
		st = platformState(t, e.pool, "api")
		return w.runs.Load() >= 1 && (st.Multiplier > 1 || st.Hold > 0)
	})
	if st.Multiplier <= 1 || st.Hold < time.Second {
		t.Fatalf("after RateLimited(2s): multiplier %g, hold %s; want it raised and a hold of about 2 s", st.Multiplier, st.Hold)
	}
	other, err := pacer.New(ctx, pacer.Config{DatabaseURL: e.url})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if res, err := other.Reserve(ctx, "api", 0); err != nil || res.Granted {
		t.Fatalf("another pacer during the hold: %+v, %v; want denied", res, err)
	}
	row := waitState(t, client, rivertype.JobStateCompleted, id)[0]
	if row.Attempt != 1 || len(row.Errors) != 0 || snoozes(row) != 1 {
		t.Fatalf("rate-limited job: attempt %d, errors %v, snoozes %d; want attempt 1 (of 1), no error, one snooze", row.Attempt, row.Errors, snoozes(row))
	}

	// Another error: neutral, returned to River (an attempt used). It
	// neither slows the fleet nor changes the reading (the multiplier is
	// no measure: it follows the climb, and a clean report of the first
	// job may land meanwhile).
	before := platformState(t, e.pool, "api")
	if before.Slowdowns < 1 {
		t.Fatalf("after RateLimited: %d slow-downs, want the episode counted", before.Slowdowns)
	}
	w.do = func(context.Context, *river.Job[taskArgs]) error { return errors.New("boom") }
	id = insertTasks(t, client, &river.InsertOpts{MaxAttempts: 1}, "api")[0]
	row = waitState(t, client, rivertype.JobStateDiscarded, id)[0]
	if len(row.Errors) != 1 || row.Errors[0].Error != "boom" {
		t.Fatalf("failed job's errors %v, want [boom]", row.Errors)
	}
	if st := platformState(t, e.pool, "api"); st.Slowdowns != before.Slowdowns || st.Estimate != before.Estimate {
		t.Fatalf("a neutral error: slow-downs %d → %d, estimate %g → %g; want both unchanged",
			before.Slowdowns, st.Slowdowns, before.Estimate, st.Estimate)
	}
}

func platformState(t *testing.T, pool *pgxpool.Pool, name string) pacer.State {
	t.Helper()
	states, err := pacer.States(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if s.Platform == name {
			return s
		}
	}
	t.Fatalf("no pacer state for %q", name)
	return pacer.State{}
}

// A job whose platform does not exist fails without running, with an error
// that says so; with CreatePlatform, the platform is created and the job
// runs.
func TestUnknownPlatform(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	w := &taskWorker{}
	ws := river.NewWorkers()
	river.AddWorker(ws, w)
	var created atomic.Value
	client := e.start(t, []rivertype.Middleware{e.middleware(t, func(c *riverpace.Config) {
		c.CreatePlatform = func(ctx context.Context, name string) error {
			if name != "made" {
				return nil // leave it missing: the job must still fail
			}
			created.Store(name)
			_, err := sources.SetPlatform(ctx, e.pool, sources.Platform{Name: name, RatePerSec: 5})
			return err
		}
	})}, ws)
	id := insertTasks(t, client, &river.InsertOpts{MaxAttempts: 1}, "nope")[0]
	row := waitState(t, client, rivertype.JobStateDiscarded, id)[0]
	if w.runs.Load() != 0 {
		t.Fatal("a job of an unknown platform ran")
	}
	if len(row.Errors) != 1 || !strings.Contains(row.Errors[0].Error, `platform "nope", which does not exist`) {
		t.Fatalf("errors %v, want one naming the missing platform", row.Errors)
	}

	id = insertTasks(t, client, nil, "made")[0]
	waitState(t, client, rivertype.JobStateCompleted, id)
	if created.Load() != "made" || w.runs.Load() != 1 {
		t.Fatalf("CreatePlatform: created %v, runs %d", created.Load(), w.runs.Load())
	}
}

// The middleware composes: with other middleware around and inside it,
// with a kind it does not pace in the same client, and installed on one
// worker rather than the client.
func TestComposes(t *testing.T) {
	e := newEnv(t)
	e.platform(t, "fast", 1000)
	e.platform(t, "other", 1000)
	outer, inner := &countingMiddleware{}, &countingMiddleware{}
	task := &taskWorker{}
	counted := &countingPacer{Pacer: e.pacer}
	other := &otherWorker{mw: e.middleware(t, func(c *riverpace.Config) {
		c.Pacer = counted
		c.Platform = func(*rivertype.JobRow) string { return "other" }
	})}
	ws := river.NewWorkers()
	river.AddWorker(ws, task)
	river.AddWorker(ws, other)
	client := e.start(t, []rivertype.Middleware{outer, e.middleware(t, func(c *riverpace.Config) { c.Pacer = counted }), inner}, ws)

	ids := insertTasks(t, client, nil, "fast", "fast", "", "")
	res, err := client.Insert(context.Background(), otherArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, client, rivertype.JobStateCompleted, append(ids, res.Job.ID)...)
	if outer.n.Load() != 5 || inner.n.Load() != 5 || task.runs.Load() != 4 || other.runs.Load() != 1 {
		t.Fatalf("outer saw %d, inner %d, task ran %d, other %d; want 5, 5, 4, 1",
			outer.n.Load(), inner.n.Load(), task.runs.Load(), other.runs.Load())
	}
	// Two paced tasks and the other kind's job asked for a slot; the two
	// unpaced did not. (Counted where the middleware asks: a job that woke
	// too late for its slot — 1 ms apart here, on a loaded machine — gave it
	// up and reserved again inside Acquire, and the pacer's own count of
	// reservations and late ones drifted from 3 on a loaded machine.)
	if n := counted.asked.Load(); n != 3 {
		t.Fatalf("%d slots asked for, want 3", n)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	p := &pacer.Pacer{}
	for _, tc := range []struct {
		cfg   riverpace.Config
		field string
	}{
		{riverpace.Config{Platform: riverpace.ByKind(nil)}, "riverpace.Config.Pacer"},
		{riverpace.Config{Pacer: p}, "riverpace.Config.Platform"},
		{riverpace.Config{Pacer: p, Platform: riverpace.ByKind(nil), StrictPlatform: riverpace.StrictByKind(nil)}, "riverpace.Config.Platform and StrictPlatform"},
		{riverpace.Config{Pacer: p, Platform: riverpace.ByKind(nil), MaxWait: -1}, "riverpace.Config.MaxWait"},
		{riverpace.Config{Pacer: p, Platform: riverpace.ByKind(nil), MaxSleepers: -1}, "riverpace.Config.MaxSleepers"},
	} {
		_, err := riverpace.New(tc.cfg)
		if !errors.Is(err, riverpace.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig naming %s", tc.cfg, err, tc.field)
		}
	}
}

func TestPlatformMappers(t *testing.T) {
	t.Parallel()
	job := &rivertype.JobRow{Kind: "k", EncodedArgs: []byte(`{"platform":"p1","n":3}`)}
	if got := riverpace.ArgsField("platform")(job); got != "p1" {
		t.Errorf("ArgsField(platform) = %q", got)
	}
	for _, key := range []string{"n", "missing"} {
		if got := riverpace.ArgsField(key)(job); got != "" {
			t.Errorf("ArgsField(%s) = %q, want unpaced", key, got)
		}
	}
	if got := riverpace.ByKind(map[string]string{"k": "p2"})(job); got != "p2" {
		t.Errorf("ByKind = %q", got)
	}
	if got, err := riverpace.StrictArgsField("platform")(job); got != "p1" || err != nil {
		t.Errorf("StrictArgsField(platform) = %q, %v", got, err)
	}
	for _, key := range []string{"n", "missing"} {
		if _, err := riverpace.StrictArgsField(key)(job); !errors.Is(err, riverpace.ErrUnmapped) {
			t.Errorf("StrictArgsField(%s): %v, want ErrUnmapped", key, err)
		}
	}
	if _, err := riverpace.StrictByKind(map[string]string{"other": "p2"})(job); !errors.Is(err, riverpace.ErrUnmapped) {
		t.Errorf("StrictByKind without the kind: %v, want ErrUnmapped", err)
	}
	if !errors.Is(riverpace.RateLimited(time.Second), riverpace.ErrRateLimited) {
		t.Error("RateLimited does not wrap ErrRateLimited")
	}
}

// With StrictPlatform, a job the mapping cannot place — a kind missing from
// StrictByKind's map (a typo), arguments without StrictArgsField's field —
// fails without running, saying why; with the same mistakes in ByKind and
// ArgsField it would run unpaced. A kind mapped to "" runs unpaced.
func TestStrictMappingNeverRunsUnpaced(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.platform(t, "fast", 1000)
	for _, tc := range []struct {
		name    string
		mapping func(*rivertype.JobRow) (string, error)
		args    taskArgs
		want    string // in the job's error; "" = it runs
	}{
		{"kind typo", riverpace.StrictByKind(map[string]string{"riverpace_tsk": "fast"}), taskArgs{Platform: "fast"},
			`kind "riverpace_task" is not in the map of StrictByKind`},
		{"field typo", riverpace.StrictArgsField("platfrom"), taskArgs{Platform: "fast"},
			`its arguments have no string field "platfrom"`},
		{"kind mapped", riverpace.StrictByKind(map[string]string{"riverpace_task": "fast"}), taskArgs{}, ""},
		{"kind unpaced on purpose", riverpace.StrictByKind(map[string]string{"riverpace_task": ""}), taskArgs{}, ""},
		{"field", riverpace.StrictArgsField("platform"), taskArgs{Platform: "fast"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &taskWorker{}
			ws := river.NewWorkers()
			river.AddWorker(ws, w)
			client := e.start(t, []rivertype.Middleware{e.middleware(t, func(c *riverpace.Config) {
				c.Platform, c.StrictPlatform = nil, tc.mapping
			})}, ws)
			before := e.pacer.Stats().Reservations
			id := insert(t, client, []river.InsertManyParams{{Args: tc.args, InsertOpts: &river.InsertOpts{MaxAttempts: 1}}})[0]
			if tc.want == "" {
				waitState(t, client, rivertype.JobStateCompleted, id)
				if w.runs.Load() != 1 {
					t.Fatalf("runs %d, want 1", w.runs.Load())
				}
				return
			}
			row := waitState(t, client, rivertype.JobStateDiscarded, id)[0]
			if w.runs.Load() != 0 || e.pacer.Stats().Reservations != before {
				t.Fatalf("a job the mapping refused ran (%d runs) or reserved", w.runs.Load())
			}
			if len(row.Errors) != 1 || !strings.Contains(row.Errors[0].Error, tc.want) || !strings.Contains(row.Errors[0].Error, "not run") {
				t.Fatalf("errors %v, want one saying %q", row.Errors, tc.want)
			}
		})
	}
}

// With MaxSleepers 1, while its platform is held (a 429 with
// Retry-After: 4), a second job snoozes while the first sleeps through the
// hold, leaving the worker to other platforms; without the limit (the
// negative control) it sleeps too, so a platform held for a few seconds
// would take every worker.
func TestMaxSleepersSnoozesTheRest(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, limit := range []int{1, 0} {
		t.Run(fmt.Sprintf("MaxSleepers=%d", limit), func(t *testing.T) {
			name := fmt.Sprintf("held%d", limit)
			e.platform(t, name, 5)
			job := &rivertype.JobRow{Kind: "k", EncodedArgs: []byte(`{"platform":"` + name + `"}`)}
			mw := e.middleware(t, func(c *riverpace.Config) { c.MaxWait = 20 * time.Second; c.MaxSleepers = limit })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			res, err := mw.Slot(ctx, job, name) // the slot now
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.pacer.Report(ctx, name, res, pacer.Feedback{Kind: pacer.Pressure, RetryAfter: 4 * time.Second}); err != nil {
				t.Fatal(err)
			}
			if e.pacer.HeldFor(name) <= 0 {
				t.Fatal("the platform is not held after a 429 with Retry-After: 4")
			}
			before := e.pacer.Stats()
			first := make(chan error, 1)
			go func() { _, err := mw.Slot(ctx, job, name); first <- err }() // sleeps through the hold
			pacetest.Poll(t, time.Minute, "the first job waiting out the hold", func() bool {
				now := e.pacer.Stats()
				return now.Reservations > before.Reservations
			})
			second := make(chan error, 1)
			go func() { _, err := mw.Slot(ctx, job, name); second <- err }()
			var snooze *rivertype.JobSnoozeError
			select {
			case err := <-second:
				if limit == 0 && err == nil {
					// Both slept for their slots and the test ran late (the
					// second's is 200 ms after the first's): no snooze.
					if err := <-first; err != nil {
						t.Fatal(err)
					}
					return
				}
				if limit == 0 || !errors.As(err, &snooze) {
					t.Fatalf("MaxSleepers %d: the second job returned %v while the first slept", limit, err)
				}
				if snooze.Duration < riverpace.MinSnooze {
					t.Fatalf("snoozed for %s, under MinSnooze", snooze.Duration)
				}
				t.Logf("the second job snoozed for %s while the first slept through the hold", snooze.Duration)
			case err := <-first:
				if err != nil {
					t.Fatal(err)
				}
				if limit > 0 {
					t.Fatal("the first job woke before the second was told to snooze")
				}
				// The control: the second job is still asleep for its slot
				// (or, on a machine that ran this late, got it: no snooze).
				cancel()
				if err := <-second; err != nil && !errors.Is(err, context.Canceled) {
					t.Fatalf("without MaxSleepers the second job should sleep for its slot; got %v", err)
				}
			}
		})
	}
}
