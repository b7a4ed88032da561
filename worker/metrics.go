package worker

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/recorder"
	"github.com/fleetpace/fleetpace/status"
)

func defaultRand() float64 { return rand.Float64() }

// Metrics are the worker's Prometheus metrics. A nil *Metrics counts nothing.
type Metrics struct {
	Registry *prometheus.Registry

	fetches   *prometheus.CounterVec
	snoozes   *prometheus.CounterVec
	lateSends *prometheus.CounterVec
	pacerWait *prometheus.HistogramVec
	enqueued  *prometheus.CounterVec
	skipped   *prometheus.CounterVec
	ticks     *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	jobs      *prometheus.CounterVec
	jobRun    *prometheus.HistogramVec
	jobWait   *prometheus.HistogramVec
	inFlight  inFlight
}

// inFlight counts, per platform, the fetches this process has sent and
// not yet got an answer (or a transport error) for.
type inFlight struct {
	mu sync.Mutex
	n  map[string]int // every platform fetched since the start, 0 included
}

func (f *inFlight) add(platform string, d int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[string]int{}
	}
	f.n[platform] += d
}

// snapshot copies the counts: every platform fetched so far (all), or
// only those with a fetch in flight.
func (f *inFlight) snapshot(all bool) map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.n))
	for p, n := range f.n {
		if all || n > 0 {
			out[p] = n
		}
	}
	return out
}

// StatusClass is the label of an HTTP status in the fetch metrics: "2xx",
// "3xx", "4xx" (429 apart), "429", "5xx", or "none" when there was no
// answer (a transport error, a refused address, a custom fetcher that is
// not HTTP).
func StatusClass(status int) string {
	switch {
	case status == 429:
		return "429"
	case status >= 200 && status < 300:
		return "2xx"
	case status >= 300 && status < 400:
		return "3xx"
	case status >= 400 && status < 500:
		return "4xx"
	case status >= 500 && status < 600:
		return "5xx"
	}
	return "none"
}

// NewMetrics registers the worker's metrics. state, when set, provides the
// fleet-wide gauges (multiplier, cooldowns, staleness): a scrape takes its
// report, read at most once per its MaxAge however often and by however
// many scrapers the worker is scraped. pacer and recorder, when set, provide
// this process's counters.
func NewMetrics(state *status.Cache, p *pacer.Pacer, rec *recorder.Recorder, logger *slog.Logger) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		Registry: reg,
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetpace_fetches_total", Help: "Fetches by platform and outcome (ok, not_modified, rate_pressure, rate_limited, failed).",
		}, []string{"platform", "outcome"}),
		snoozes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetpace_job_snoozes_total", Help: "Fetch jobs snoozed, by platform and reason (pacer wait too long, cooldown).",
		}, []string{"platform", "reason"}),
		lateSends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetpace_fetch_late_sends_total", Help: "Fetches that sent nothing because the request would have left after its slot's SendBy (the process was paused between the slot and the write); the slot was given back and a new one taken.",
		}, []string{"platform"}),
		pacerWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fleetpace_pacer_wait_seconds", Help: "Wait granted by the pacer before a fetch.",
			Buckets: []float64{0, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5},
		}, []string{"platform"}),
		enqueued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetpace_scan_enqueued_total", Help: "Sources enqueued by this process's scan ticks.",
		}, []string{"platform"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetpace_scan_skipped_cooldown_total", Help: "Scan ticks that left a platform out because it was cooling down.",
		}, []string{"platform"}),
		ticks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetpace_scan_ticks_total", Help: "Scan ticks by result (ran, skipped: another tick held the lock, failed).",
		}, []string{"result"}),
	}
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fleetpace_fetch_duration_seconds",
		Help:    "How long fetches took, from the request sent to the answer read, by platform and status class (2xx, 3xx, 4xx, 429, 5xx; none: no answer).",
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"platform", "status_class"})
	m.jobs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetpace_river_jobs_worked_total",
		Help: "River jobs this process worked, by kind and result (completed, snoozed, cancelled, retried: an error River retries, discarded: an error on the last attempt).",
	}, []string{"kind", "result"})
	m.jobRun = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "fleetpace_river_job_run_seconds", Help: "How long River jobs ran in this process (pacer wait, fetch and record), by kind.",
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
	}, []string{"kind"})
	m.jobWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "fleetpace_river_job_queue_wait_seconds", Help: "How long River jobs waited between being due (queued, or their snooze's end) and starting to run in this process, by kind.",
		Buckets: []float64{0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900},
	}, []string{"kind"})
	reg.MustRegister(m.fetches, m.snoozes, m.lateSends, m.pacerWait, m.enqueued, m.skipped, m.ticks, m.duration, m.jobs, m.jobRun, m.jobWait,
		inFlightCollector{&m.inFlight})
	reg.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	if p != nil {
		reg.MustRegister(pacerCollector{p})
	}
	if rec != nil {
		reg.MustRegister(recorderCollector{rec})
	}
	if state != nil {
		reg.MustRegister(&stateCollector{state: state, logger: logger})
	}
	return m
}

func (m *Metrics) fetched(platform string, outcome fetch.Outcome) {
	if m != nil {
		m.fetches.WithLabelValues(platform, string(outcome)).Inc()
	}
}

// sending counts a fetch of platform in flight until the function it
// returns is called with the answer's status (0: none) and how long the
// fetch took.
func (m *Metrics) sending(platform string) func(status int, took time.Duration) {
	if m == nil {
		return func(int, time.Duration) {}
	}
	m.inFlight.add(platform, 1)
	return func(status int, took time.Duration) {
		m.inFlight.add(platform, -1)
		m.duration.WithLabelValues(platform, StatusClass(status)).Observe(took.Seconds())
	}
}

// InFlight is, per platform, how many fetches this process has sent and
// not yet got an answer for (platforms with none are left out). Nil
// Metrics: none.
func (m *Metrics) InFlight() map[string]int {
	if m == nil {
		return nil
	}
	return m.inFlight.snapshot(false)
}

var descInFlight = prometheus.NewDesc("fleetpace_fetches_in_flight", "Fetches this process has sent and not yet got an answer for, by platform.", []string{"platform"}, nil)

type inFlightCollector struct{ f *inFlight }

func (c inFlightCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descInFlight }

func (c inFlightCollector) Collect(ch chan<- prometheus.Metric) {
	for p, n := range c.f.snapshot(true) {
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(n), p)
	}
}

func (m *Metrics) snoozed(platform, reason string) {
	if m != nil {
		m.snoozes.WithLabelValues(platform, reason).Inc()
	}
}

func (m *Metrics) lateSend(platform string) {
	if m != nil {
		m.lateSends.WithLabelValues(platform).Inc()
	}
}

func (m *Metrics) waited(platform string, d time.Duration) {
	if m != nil {
		m.pacerWait.WithLabelValues(platform).Observe(d.Seconds())
	}
}

func (m *Metrics) tick(result string, enqueued map[string]int, cooling []string) {
	if m == nil {
		return
	}
	m.ticks.WithLabelValues(result).Inc()
	for p, n := range enqueued {
		m.enqueued.WithLabelValues(p).Add(float64(n))
	}
	for _, p := range cooling {
		m.skipped.WithLabelValues(p).Inc()
	}
}

var (
	descReservations = prometheus.NewDesc("fleetpace_pacer_reservations_total", "Pacer reservations made by this process, by result (granted, denied).", []string{"result"}, nil)
	descDegraded     = prometheus.NewDesc("fleetpace_pacer_degraded_reservations_total", "Reservations paced locally because the database was unreachable.", nil, nil)
	descDropped      = prometheus.NewDesc("fleetpace_pacer_reports_dropped_total", "Pacer reports lost because the database was unreachable.", nil, nil)
	descAttempts     = prometheus.NewDesc("fleetpace_pacer_connect_attempts_total", "Connection attempts by the pacer's pool.", nil, nil)
	descSlowConnect  = prometheus.NewDesc("fleetpace_pacer_slow_connects_total", "Pacer calls made again after a connection took longer than the connect timeout while the database answered on the pool's other connections (no outage).", nil, nil)
	descDown         = prometheus.NewDesc("fleetpace_pacer_degraded", "1 while the pacer cannot reach the database and paces locally.", nil, nil)
	descFleet        = prometheus.NewDesc("fleetpace_fleet_size", "Live worker processes seen by this process's heartbeat.", nil, nil)
	descFromBlock    = prometheus.NewDesc("fleetpace_pacer_block_reservations_total", "Granted reservations served from a block of slots, without a round trip.", nil, nil)
	descBlockWaste   = prometheus.NewDesc("fleetpace_pacer_block_slots_discarded_total", "Slots of blocks that went unused (too late, or dropped on rate pressure).", nil, nil)
	descDeferred     = prometheus.NewDesc("fleetpace_pacer_reports_batched_total", "Clean reports sent in batches rather than one statement each.", nil, nil)
	descEvents       = prometheus.NewDesc("fleetpace_pacer_slowdowns_total", "Slow-downs (pressure, announced limits, holds, pauses) this process learnt of, by how (all; notified: through LISTEN/NOTIFY).", []string{"how"}, nil)
	descRespaced     = prometheus.NewDesc("fleetpace_pacer_slots_respaced_total", "Granted slots moved later by a slow-down before they were used.", nil, nil)
	descGivenBack    = prometheus.NewDesc("fleetpace_pacer_slots_given_back_total", "Granted slots given back: a slow-down moved them beyond the job's wait (the job snoozes).", nil, nil)
	descLate         = prometheus.NewDesc("fleetpace_pacer_slots_late_total", "Granted slots given up because the job woke too late for them.", nil, nil)
	descOverruns     = prometheus.NewDesc("fleetpace_pacer_overruns_total", "Requests written past their slot's guarantee (the process was paused between the send-by check and the write): the platform's schedule moved later by as much.", nil, nil)
	descListening    = prometheus.NewDesc("fleetpace_pacer_listening", "1 while the pacer's slow-down listener is connected.", nil, nil)

	descRecBatches = prometheus.NewDesc("fleetpace_record_statements_total", "Statements that wrote checks (group commit).", nil, nil)
	descRecChecks  = prometheus.NewDesc("fleetpace_record_checks_total", "Checks written, by result (written; refused: the database refused the check, recorded as a failed check instead; failed: lost with their statement, the scan re-queues their sources).", []string{"result"}, nil)
	descRecQueued  = prometheus.NewDesc("fleetpace_record_queued", "Checks waiting to be written.", nil, nil)
)

type recorderCollector struct{ r *recorder.Recorder }

func (c recorderCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRecBatches, descRecChecks, descRecQueued} {
		ch <- d
	}
}

func (c recorderCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.r.Stats()
	ch <- prometheus.MustNewConstMetric(descRecBatches, prometheus.CounterValue, float64(s.Batches))
	ch <- prometheus.MustNewConstMetric(descRecChecks, prometheus.CounterValue, float64(s.Records-s.Failed-s.Refused), "written")
	ch <- prometheus.MustNewConstMetric(descRecChecks, prometheus.CounterValue, float64(s.Refused), "refused")
	ch <- prometheus.MustNewConstMetric(descRecChecks, prometheus.CounterValue, float64(s.Failed), "failed")
	ch <- prometheus.MustNewConstMetric(descRecQueued, prometheus.GaugeValue, float64(s.Queued))
}

type pacerCollector struct{ p *pacer.Pacer }

func (c pacerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReservations, descDegraded, descDropped, descAttempts, descSlowConnect, descDown, descFleet,
		descFromBlock, descBlockWaste, descDeferred, descEvents, descRespaced, descGivenBack, descLate, descOverruns, descListening} {
		ch <- d
	}
}

func (c pacerCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.p.Stats()
	ch <- prometheus.MustNewConstMetric(descReservations, prometheus.CounterValue, float64(s.Granted), "granted")
	ch <- prometheus.MustNewConstMetric(descReservations, prometheus.CounterValue, float64(s.Denied), "denied")
	ch <- prometheus.MustNewConstMetric(descDegraded, prometheus.CounterValue, float64(s.Degraded))
	ch <- prometheus.MustNewConstMetric(descDropped, prometheus.CounterValue, float64(s.ReportsDropped))
	ch <- prometheus.MustNewConstMetric(descAttempts, prometheus.CounterValue, float64(s.ConnectAttempts))
	ch <- prometheus.MustNewConstMetric(descSlowConnect, prometheus.CounterValue, float64(s.SlowConnects))
	down := 0.0
	if s.Down {
		down = 1
	}
	ch <- prometheus.MustNewConstMetric(descDown, prometheus.GaugeValue, down)
	ch <- prometheus.MustNewConstMetric(descFleet, prometheus.GaugeValue, float64(s.FleetSize))
	ch <- prometheus.MustNewConstMetric(descFromBlock, prometheus.CounterValue, float64(s.FromBlock))
	ch <- prometheus.MustNewConstMetric(descBlockWaste, prometheus.CounterValue, float64(s.BlockDiscarded))
	ch <- prometheus.MustNewConstMetric(descDeferred, prometheus.CounterValue, float64(s.ReportsDeferred))
	ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(s.Events), "all")
	ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(s.Notifications), "notified")
	ch <- prometheus.MustNewConstMetric(descRespaced, prometheus.CounterValue, float64(s.Respaced))
	ch <- prometheus.MustNewConstMetric(descGivenBack, prometheus.CounterValue, float64(s.GivenBack))
	ch <- prometheus.MustNewConstMetric(descLate, prometheus.CounterValue, float64(s.Late))
	ch <- prometheus.MustNewConstMetric(descOverruns, prometheus.CounterValue, float64(s.Overruns))
	listening := 0.0
	if s.Listening {
		listening = 1
	}
	ch <- prometheus.MustNewConstMetric(descListening, prometheus.GaugeValue, listening)
}

var (
	descMultiplier = prometheus.NewDesc("fleetpace_pacer_multiplier", "Shared backoff multiplier per platform (1 = full configured rate).", []string{"platform"}, nil)
	descCeiling    = prometheus.NewDesc("fleetpace_platform_rate_ceiling", "Configured fleet-wide rate ceiling per platform, requests per second.", []string{"platform"}, nil)
	descCooldown   = prometheus.NewDesc("fleetpace_cooldown_remaining_seconds", "Remaining cooldown per platform (0 when not cooling down).", []string{"platform"}, nil)
	descCooldowns  = prometheus.NewDesc("fleetpace_cooldowns_active", "Platforms cooling down now.", nil, nil)
	descQueued     = prometheus.NewDesc("fleetpace_sources_queued", "Sources with a fetch job queued or running.", []string{"platform"}, nil)
	descDue        = prometheus.NewDesc("fleetpace_sources_due", "Sources due now and not queued.", []string{"platform"}, nil)
	descStaleMax   = prometheus.NewDesc("fleetpace_staleness_max_seconds", "How late the most overdue source of the platform is.", []string{"platform"}, nil)
	descStaleP95   = prometheus.NewDesc("fleetpace_staleness_p95_seconds", "95th percentile of lateness among the platform's overdue sources.", []string{"platform"}, nil)
	descUp         = prometheus.NewDesc("fleetpace_database_up", "1 if the fleet-wide state could be read at its last refresh.", nil, nil)
	descEffective  = prometheus.NewDesc("fleetpace_pacer_effective_rate", "Rate the fleet paces the platform at now, requests per second, and what decides it (ceiling, backoff, announced, hold, paused).", []string{"platform", "paced_by"}, nil)
	descAnnounced  = prometheus.NewDesc("fleetpace_pacer_announced_rate", "Rate the destination's rate-limit headers allow now, requests per second (0: none announced).", []string{"platform"}, nil)
	descHold       = prometheus.NewDesc("fleetpace_pacer_hold_remaining_seconds", "Remaining fleet-wide hold (Retry-After, exhausted quota, cooldown) per platform.", []string{"platform"}, nil)
	descCondition  = prometheus.NewDesc("fleetpace_platform_condition", "1 for each thing the platform is doing now (kind: paused, cooling_down, holding, throttled, backing_off, announced, window, refused, waiting, running).", []string{"platform", "kind"}, nil)
	descFleetIn    = prometheus.NewDesc("fleetpace_fleet_fetches_in_flight", "Fetches sent and not answered yet, every live worker together (as of their last heartbeats), per platform.", []string{"platform"}, nil)
	descUsed       = prometheus.NewDesc("fleetpace_platform_used_rate", "Fetches per second fleet-wide over the last minute, from the fetch history, per platform.", []string{"platform"}, nil)
	descRefused    = prometheus.NewDesc("fleetpace_platform_refused_per_minute", "429 and 503 answers per minute fleet-wide over the last minute, from the fetch history, per platform.", []string{"platform"}, nil)
	descJobs       = prometheus.NewDesc("fleetpace_river_jobs", "Unfinished River jobs fleet-wide by kind and state (available, running, scheduled, retryable, pending).", []string{"kind", "state"}, nil)

	// Keys: per-platform aggregates, and the top keys under pressure only
	// (status.Cache.TopKeys per platform: bounded cardinality).
	descKeysInUse    = prometheus.NewDesc("fleetpace_keys_in_use", "Keys of the platform with a pace row (reserved lately; idle ones are removed).", []string{"platform"}, nil)
	descKeysHeld     = prometheus.NewDesc("fleetpace_keys_held", "Keys of the platform held now (a 429 with Retry-After or an exhausted quota for that key).", []string{"platform"}, nil)
	descKeysSlowed   = prometheus.NewDesc("fleetpace_keys_slowed", "Keys of the platform paced more than 10 % under their rate.", []string{"platform"}, nil)
	descKeysInFlight = prometheus.NewDesc("fleetpace_keys_in_flight", "Open requests (leases) of the platform's keys, where a per-key cap is in force.", []string{"platform"}, nil)
	descLeases       = prometheus.NewDesc("fleetpace_platform_in_flight", "Open requests (leases) to the platform, where its cap (max_in_flight) is in force.", []string{"platform"}, nil)
	descKeyHold      = prometheus.NewDesc("fleetpace_key_hold_remaining_seconds", "Remaining hold of one of the platform's top keys under pressure.", []string{"platform", "key"}, nil)
	descKeyEffective = prometheus.NewDesc("fleetpace_key_effective_rate", "Pace of one of the platform's top keys under pressure, requests per second.", []string{"platform", "key"}, nil)
	descKeyInFlight  = prometheus.NewDesc("fleetpace_key_in_flight", "Open requests of one of the platform's top keys under pressure.", []string{"platform", "key"}, nil)
)

// stateCollector reports the fleet-wide state from a shared status report,
// refreshed at most once per the cache's MaxAge (one read-only transaction,
// bounded by a short timeout; no retry).
type stateCollector struct {
	state  *status.Cache
	logger *slog.Logger
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMultiplier, descCeiling, descCooldown, descCooldowns, descQueued, descDue, descStaleMax, descStaleP95, descUp,
		descEffective, descAnnounced, descHold, descCondition, descFleetIn, descUsed, descRefused, descJobs,
		descKeysInUse, descKeysHeld, descKeysSlowed, descKeysInFlight, descLeases,
		descKeyHold, descKeyEffective, descKeyInFlight} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	rep, err := c.state.Get(ctx)
	if err != nil {
		if c.logger != nil {
			c.logger.Debug("metrics: fleet state unavailable", "err", err)
		}
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, 1)
	active := 0
	for _, p := range rep.Platforms {
		remaining := 0.0
		if p.Cooldown != nil {
			remaining = p.Cooldown.Remaining.Seconds()
			active++
		}
		ch <- prometheus.MustNewConstMetric(descMultiplier, prometheus.GaugeValue, p.Pace.Multiplier, p.Name)
		ch <- prometheus.MustNewConstMetric(descEffective, prometheus.GaugeValue, p.Pace.EffectiveRate, p.Name, p.Pace.PacedBy)
		ch <- prometheus.MustNewConstMetric(descAnnounced, prometheus.GaugeValue, p.Pace.AnnouncedRate, p.Name)
		ch <- prometheus.MustNewConstMetric(descHold, prometheus.GaugeValue, p.Pace.Hold.Seconds(), p.Name)
		ch <- prometheus.MustNewConstMetric(descCeiling, prometheus.GaugeValue, p.RatePerSec, p.Name)
		ch <- prometheus.MustNewConstMetric(descCooldown, prometheus.GaugeValue, remaining, p.Name)
		ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(p.Counts.Queued), p.Name)
		ch <- prometheus.MustNewConstMetric(descDue, prometheus.GaugeValue, float64(p.Counts.Due), p.Name)
		ch <- prometheus.MustNewConstMetric(descStaleMax, prometheus.GaugeValue, p.Counts.StaleMax.Seconds(), p.Name)
		ch <- prometheus.MustNewConstMetric(descStaleP95, prometheus.GaugeValue, p.Counts.StaleP95.Seconds(), p.Name)
		ch <- prometheus.MustNewConstMetric(descFleetIn, prometheus.GaugeValue, float64(p.Use.InFlight), p.Name)
		ch <- prometheus.MustNewConstMetric(descUsed, prometheus.GaugeValue, p.Use.UsedPerSec, p.Name)
		ch <- prometheus.MustNewConstMetric(descRefused, prometheus.GaugeValue, p.Use.RefusedPerMin, p.Name)
		seen := map[string]bool{}
		for _, c := range p.State {
			if !seen[c.Kind] {
				seen[c.Kind] = true
				ch <- prometheus.MustNewConstMetric(descCondition, prometheus.GaugeValue, 1, p.Name, c.Kind)
			}
		}
		if k := p.Keys; k != nil {
			ch <- prometheus.MustNewConstMetric(descKeysInUse, prometheus.GaugeValue, float64(k.InUse), p.Name)
			ch <- prometheus.MustNewConstMetric(descKeysHeld, prometheus.GaugeValue, float64(k.Held), p.Name)
			ch <- prometheus.MustNewConstMetric(descKeysSlowed, prometheus.GaugeValue, float64(k.Slowed), p.Name)
			ch <- prometheus.MustNewConstMetric(descKeysInFlight, prometheus.GaugeValue, float64(k.InFlight), p.Name)
			ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(k.PlatformInFlight), p.Name)
			for _, t := range k.Top {
				ch <- prometheus.MustNewConstMetric(descKeyHold, prometheus.GaugeValue, t.Hold.Seconds(), p.Name, t.Key)
				ch <- prometheus.MustNewConstMetric(descKeyEffective, prometheus.GaugeValue, t.EffectiveRate, p.Name, t.Key)
				ch <- prometheus.MustNewConstMetric(descKeyInFlight, prometheus.GaugeValue, float64(t.InFlight), p.Name, t.Key)
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(descCooldowns, prometheus.GaugeValue, float64(active))
	for _, j := range rep.Jobs {
		ch <- prometheus.MustNewConstMetric(descJobs, prometheus.GaugeValue, float64(j.Jobs), j.Kind, j.State)
	}
}
