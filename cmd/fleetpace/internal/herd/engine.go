package herd

import (
	"context"
	"math"
	"math/rand/v2"
	"time"

	"github.com/fleetpace/fleetpace/poller"
)

// Event kinds. Events at one instant are handled in the order they were
// scheduled.
const (
	evPhase  uint8 = iota // scenario boundary
	evDone                // a claim finished
	evGiveUp              // a retrier's budget ran out
	evPoll                // a poller wakes
	evTick                // 100-ms bookkeeping
)

type event struct {
	at   int64 // virtual ns
	seq  uint64
	who  int32
	gen  uint32
	kind uint8
}

func (a *event) less(b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

// eventHeap is a binary min-heap by (at, seq): ties are handled in the order
// they were scheduled, so a run is deterministic.
type eventHeap []event

func (h *eventHeap) push(e event) {
	*h = append(*h, e)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s[i].less(&s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && s[r].less(&s[l]) {
			m = r
		}
		if !s[m].less(&s[i]) {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// Poller states.
const (
	sleeping uint8 = iota
	pending
	claiming
)

type simPoller struct {
	sched *poller.Schedule
	gen   uint32
	state uint8
}

type waiter struct {
	who int32
	gen uint32
}

// claim is a claim in flight: it ends when the work clock reaches done.
type claim struct {
	who   int32
	gen   uint32
	done  float64 // work clock at which it ends
	start int64   // virtual ns, for the longest claim time
}

const tick = 100 * time.Millisecond

// sim is one mode's fleet. Not safe for concurrent use.
type sim struct {
	cfg   *SimConfig
	mode  Mode
	rnd   *rand.Rand
	ratio float64

	now  int64
	seq  uint64
	h    eventHeap
	ps   []simPoller
	fifo []waiter // pending pollers, oldest first; stale entries skipped
	head int

	busy, pending int
	down, window  bool

	// Claims in flight progress together at rate: 1 on an idle server,
	// less under attempt load or in the saturation window. work is the
	// claim work (in unloaded nanoseconds) every claim in flight has received
	// since the start; all claims need ClaimTime of it, so they end in the
	// order they started.
	work     float64
	rate     float64
	claims   []claim
	claimHd  int
	doneGen  uint32  // invalidates a stale completion event
	doneAt   float64 // work target the pending completion event is for
	doneRate float64 // rate it was computed with

	// attempts in the last 10 ticks (a sliding second), for the server load.
	ring    [10]int
	ringIdx int
	ringSum int
	knocks  float64 // retry knocks not yet attributed to a second

	r ModeResult
}

func newSim(cfg *SimConfig, m Mode) *sim {
	modeIdx := uint64(0)
	for i, am := range AllModes() {
		if am == m {
			modeIdx = uint64(i)
		}
	}
	s := &sim{cfg: cfg, mode: m, rnd: rand.New(rand.NewPCG(cfg.Seed, 0x6865726400+modeIdx))}
	if m.CycleJitter {
		s.ratio = cfg.JitterRatio
	}
	secs := int((cfg.Duration + time.Second - 1) / time.Second)
	s.r = ModeResult{Mode: m, Name: m.Label(), Polls: make([]int, secs), Served: make([]int, secs), Refused: make([]int, secs),
		Busy: make([]int, secs), Pending: make([]int, secs)}
	return s
}

func (s *sim) schedule(at int64, kind uint8, who int32, gen uint32) {
	s.seq++
	s.h.push(event{at: at, seq: s.seq, kind: kind, who: who, gen: gen})
}

func (s *sim) sec() int {
	i := int(s.now / int64(time.Second))
	return min(i, len(s.r.Polls)-1)
}

func (s *sim) capacity() int {
	if s.window {
		return s.cfg.Backends - s.cfg.Scenario.Hold
	}
	return s.cfg.Backends
}

func (s *sim) run(ctx context.Context) (*ModeResult, error) {
	cfg := s.cfg
	n := cfg.Pollers
	s.ps = make([]simPoller, n)
	s.h = make(eventHeap, 0, n+64)
	s.rate = 1
	if cfg.Scenario.Kind == Restart {
		for i := range s.ps {
			s.ps[i].sched = poller.NewSchedule(cfg.Base, cfg.Max)
			s.ps[i].sched.Settle() // as poller.Run does
			var d time.Duration
			if s.mode.StartupJitter {
				d = poller.StartupDelay(cfg.Max, s.rnd.Float64())
			}
			s.schedule(int64(d), evPoll, int32(i), 0)
		}
	} else {
		// A warm fleet: schedules backed off to Max, next polls spread over
		// [0, Max) — the same phases in every mode.
		warm := rand.New(rand.NewPCG(cfg.Seed, 0x7761726d))
		for i := range s.ps {
			sc := poller.NewSchedule(cfg.Base, cfg.Max)
			for sc.Next(false) <= cfg.Max/2 {
			}
			s.ps[i].sched = sc
			s.schedule(int64(float64(cfg.Max)*warm.Float64()), evPoll, int32(i), 0)
		}
		s.schedule(int64(cfg.Scenario.At), evPhase, 0, 0)
		s.schedule(int64(cfg.Scenario.At+cfg.Scenario.For), evPhase, 1, 0)
	}
	s.schedule(0, evTick, 0, 0)

	end := int64(cfg.Duration)
	for len(s.h) > 0 && s.h[0].at < end {
		e := s.h.pop()
		s.advance(e.at)
		s.r.Events++
		if s.r.Events&0xfffff == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		switch e.kind {
		case evPoll:
			if s.ps[e.who].gen == e.gen {
				s.poll(e.who)
			}
		case evDone:
			if e.gen == s.doneGen {
				s.doneAt = -1 // always schedule the next one
				s.completeClaims()
			}
		case evGiveUp:
			if p := &s.ps[e.who]; p.gen == e.gen && p.state == pending {
				s.pending--
				s.finish(e.who, true)
			}
		case evTick:
			s.onTick()
			s.schedule(e.at+int64(tick), evTick, 0, 0)
		case evPhase:
			s.phase(e.who == 0)
		}
		s.rescheduleDone()
	}
	s.advance(end)
	s.summarize()
	return &s.r, nil
}

// advance moves virtual time to t: the claims in flight progress, and the
// pending retriers' knocks since the last event are counted.
func (s *sim) advance(t int64) {
	if t <= s.now {
		return
	}
	dt := float64(t - s.now)
	if s.busy > 0 {
		s.work += s.rate * dt
	}
	if s.pending > 0 {
		s.knocks += float64(s.pending) * dt / float64(s.cfg.RetryDelay)
		if whole := math.Floor(s.knocks); whole > 0 {
			s.r.Refused[s.sec()] += int(whole)
			s.r.RefusedTotal += int64(whole)
			s.knocks -= whole
		}
	}
	s.now = t
}

func (s *sim) onTick() {
	s.ringIdx = (s.ringIdx + 1) % len(s.ring)
	s.ringSum -= s.ring[s.ringIdx]
	s.ring[s.ringIdx] = 0
	i := s.sec()
	s.r.Busy[i] = max(s.r.Busy[i], s.busy)
	s.r.Pending[i] = max(s.r.Pending[i], s.pending)
}

// phase starts (start=true) or ends the scenario's event.
func (s *sim) phase(start bool) {
	switch s.cfg.Scenario.Kind {
	case DBRestart:
		s.down = start
		if start {
			// Every claim in flight fails with its connection.
			for _, c := range s.claims[s.claimHd:] {
				if p := &s.ps[c.who]; p.gen == c.gen && p.state == claiming {
					s.busy--
					s.finish(c.who, true)
				}
			}
			s.claims, s.claimHd = s.claims[:0], 0
		}
	case Saturation:
		s.window = start
	}
	if !start {
		s.grantPending()
	}
}

// poll is one cycle's first connection attempt.
func (s *sim) poll(who int32) {
	i := s.sec()
	s.r.Polls[i]++
	s.ring[s.ringIdx]++
	s.ringSum++
	if s.down || s.busy >= s.capacity() {
		s.r.Refused[i]++
		s.r.RefusedTotal++
		if !s.mode.Retry {
			s.finish(who, true)
			return
		}
		p := &s.ps[who]
		p.gen++
		p.state = pending
		s.pending++
		s.r.Pending[i] = max(s.r.Pending[i], s.pending)
		s.fifo = append(s.fifo, waiter{who: who, gen: p.gen})
		s.schedule(s.now+int64(s.cfg.RetryFor), evGiveUp, who, p.gen)
		return
	}
	s.grant(who)
}

// grant gives who a backend for one claim.
func (s *sim) grant(who int32) {
	p := &s.ps[who]
	p.gen++
	p.state = claiming
	s.busy++
	i := s.sec()
	s.r.Served[i]++
	s.r.ServedTotal++
	s.r.Busy[i] = max(s.r.Busy[i], s.busy)
	s.claims = append(s.claims, claim{who: who, gen: p.gen, done: s.work + float64(s.cfg.ClaimTime), start: s.now})
}

// completeClaims ends every claim whose work is done.
func (s *sim) completeClaims() {
	freed := false
	for s.claimHd < len(s.claims) {
		c := s.claims[s.claimHd]
		if c.done > s.work+1e-3 {
			break
		}
		s.claimHd++
		if p := &s.ps[c.who]; p.gen != c.gen || p.state != claiming {
			continue
		}
		s.r.MaxClaimTime = max(s.r.MaxClaimTime, float64(s.now-c.start)/float64(time.Second))
		s.busy--
		s.finish(c.who, false)
		freed = true
	}
	if s.claimHd > 4096 && s.claimHd*2 > len(s.claims) {
		s.claims = append(s.claims[:0], s.claims[s.claimHd:]...)
		s.claimHd = 0
	}
	if freed {
		s.grantPending()
	}
}

// rescheduleDone recomputes the claims' rate and, if it or the oldest claim
// changed, schedules the next completion.
func (s *sim) rescheduleDone() {
	s.rate = s.claimRate()
	for s.claimHd < len(s.claims) {
		c := s.claims[s.claimHd]
		if p := &s.ps[c.who]; p.gen == c.gen && p.state == claiming {
			break
		}
		s.claimHd++
	}
	if s.claimHd == len(s.claims) {
		s.doneGen++
		s.doneAt, s.doneRate = 0, 0
		return
	}
	target := s.claims[s.claimHd].done
	if target == s.doneAt && s.rate == s.doneRate {
		return
	}
	s.doneGen++
	s.doneAt, s.doneRate = target, s.rate
	wait := math.Max(0, target-s.work) / s.rate
	s.schedule(s.now+int64(math.Ceil(wait)), evDone, 0, s.doneGen)
}

// claimRate is how fast claims progress: 1 on an idle server, divided by
// the saturation window's slowdown, times the share of CPU that connection
// attempts leave.
func (s *sim) claimRate() float64 {
	r := 1.0
	if s.window {
		r /= s.cfg.Scenario.Slowdown
	}
	if s.cfg.AttemptCost > 0 {
		perSec := float64(s.ringSum) + float64(s.pending)*float64(time.Second)/float64(s.cfg.RetryDelay)
		r *= 1 - min(0.95, perSec*s.cfg.AttemptCost.Seconds()/float64(s.cfg.Cores))
	}
	return r
}

// grantPending hands free backends to the longest-waiting retriers.
func (s *sim) grantPending() {
	if s.down {
		return
	}
	for s.pending > 0 && s.busy < s.capacity() && s.head < len(s.fifo) {
		w := s.fifo[s.head]
		s.head++
		if p := &s.ps[w.who]; p.gen != w.gen || p.state != pending {
			continue
		}
		s.pending--
		s.grant(w.who)
	}
	if s.head > 4096 && s.head*2 > len(s.fifo) {
		s.fifo = append(s.fifo[:0], s.fifo[s.head:]...)
		s.head = 0
	}
}

// finish ends who's cycle (failed or not; an idle fleet's cycle finds no
// work either way) and schedules its next poll the way poller.Run does.
func (s *sim) finish(who int32, failed bool) {
	p := &s.ps[who]
	if failed {
		s.r.FailedCycles++
	}
	p.gen++
	p.state = sleeping
	sleep := poller.Jitter(p.sched.Next(false), s.ratio, s.rnd.Float64())
	s.schedule(s.now+int64(sleep), evPoll, who, p.gen)
}

func (s *sim) summarize() {
	r := &s.r
	total := 0
	for _, v := range r.Polls {
		total += v
		r.PeakPolls = max(r.PeakPolls, v)
	}
	for _, v := range r.Served {
		r.PeakServed = max(r.PeakServed, v)
	}
	for _, v := range r.Busy {
		r.PeakBusy = max(r.PeakBusy, v)
	}
	for _, v := range r.Pending {
		r.PeakPending = max(r.PeakPending, v)
	}
	r.MeanPolls = float64(total) / s.cfg.Duration.Seconds()
	if r.MeanPolls > 0 {
		r.PeakToMean = float64(r.PeakPolls) / r.MeanPolls
	}
	// Drained: from the event's end to the end of the last second with a
	// refused attempt or a pending poller. It counts only if the run goes on
	// quietly after it for the longest sleep a poller takes, so a herd that
	// comes back every Max would have shown up.
	endSec := int(s.cfg.EventEnd() / time.Second)
	last := -1
	for i := endSec; i < len(r.Polls); i++ {
		if r.Refused[i] > 0 || r.Pending[i] > 0 {
			last = i
		}
	}
	if last >= 0 {
		r.DrainSeconds = max(0, float64(last+1)-s.cfg.EventEnd().Seconds())
	}
	r.Drained = float64(last+1)+s.cfg.LongestSleep().Seconds() <= s.cfg.Duration.Seconds()
	if !r.Drained {
		r.DrainSeconds = (s.cfg.Duration - s.cfg.EventEnd()).Seconds()
	}
}
