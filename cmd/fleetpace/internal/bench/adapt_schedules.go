package bench

import (
	"fmt"
	"strings"
	"time"

	"github.com/fleetpace/fleetpace/cmd/fleetpace/internal/bench/localpace"
	"github.com/fleetpace/fleetpace/sources"
)

// Schedule is how a platform adapts: its sources.Platform settings, or a
// pacer local to each worker process (Local) instead of the shared one.
type Schedule struct {
	Name string `json:"name"`
	// Local, if set, paces the platform in each process alone
	// (localpace.KindAWS or localpace.KindOracle); the settings below are
	// then not used.
	Local      string  `json:"local,omitempty"`
	Adapt      string  `json:"adapt,omitempty"`
	Backoff    float64 `json:"backoff_factor,omitempty"`
	Recovery   float64 `json:"recovery_factor,omitempty"`
	DecayAfter int     `json:"decay_after,omitempty"`
	Probe      bool    `json:"probe,omitempty"`
	Headers    bool    `json:"use_headers,omitempty"`
	Respace    bool    `json:"respace,omitempty"`
}

// Schedule names of a run without a sweep.
const (
	ScheduleDefault = "default"
	ScheduleClassic = "classic"
	ScheduleAWS     = "aws"
	ScheduleOracle  = "oracle"
)

// ClassicSchedule is the classic multiplicative schedule without adaptive
// pacing's refinements: the multiplier, ×2 on pressure, ÷2 after 100 clean
// responses, no probing, no headers, slots already granted used as granted.
var ClassicSchedule = Schedule{Name: ScheduleClassic, Adapt: sources.AdaptMultiplier, Backoff: 2, Recovery: 2, DecayAfter: 100}

// AWSSchedule is the AWS SDKs' adaptive retry mode in every process on its
// own (a token bucket whose rate follows CUBIC over the measured send rate,
// no shared state), each process capped at its share of the ceiling.
var AWSSchedule = Schedule{Name: ScheduleAWS, Local: localpace.KindAWS}

// OracleSchedule paces every process at OracleShare of the destination's
// allowance ÷ processes, following its steps, without adaptation, the
// processes' slots in turn (one grid, a phase each): the physical
// reference.
var OracleSchedule = Schedule{Name: ScheduleOracle, Local: localpace.KindOracle}

// OracleShare is the share of the allowance the oracle paces at: what a
// fleet that knew the limit would leave for jitter. At exactly the
// allowance half its requests reached a strict limiter a little early and
// were refused (0.52 of a strict bucket of 8/s, 31 % refused): no
// reference.
const OracleShare = 0.97

// DefaultSchedule is a new platform's: the defaults of package sources.
func DefaultSchedule() Schedule {
	return Schedule{Name: ScheduleDefault, Adapt: sources.AdaptEstimate, Backoff: sources.DefaultBackoffFactor, Recovery: sources.DefaultRecoveryFactor,
		DecayAfter: sources.DefaultDecayAfter, Probe: true, Headers: true, Respace: true}
}

// schedules are a run's schedules: default, classic, aws and oracle side by
// side; or a sweep of the multiplier's settings (its backoff, recovery and
// decay shape the multiplier only).
func (c *AdaptConfig) schedules() []Schedule {
	sweepBase := func() Schedule {
		s := DefaultSchedule()
		s.Adapt = sources.AdaptMultiplier
		return s
	}
	switch c.Sweep {
	case "decay":
		var out []Schedule
		for _, n := range SweepDecay {
			s := sweepBase()
			s.Name, s.DecayAfter = fmt.Sprintf("n%d", n), n
			out = append(out, s)
		}
		return out
	case "factors":
		var out []Schedule
		for _, f := range SweepBackoff {
			for _, r := range SweepRecovery {
				s := sweepBase()
				s.Name = strings.ReplaceAll(fmt.Sprintf("f%g-r%g", f, r), ".", "_")
				s.Backoff, s.Recovery = f, r
				out = append(out, s)
			}
		}
		return out
	}
	return []Schedule{DefaultSchedule(), ClassicSchedule, AWSSchedule, OracleSchedule}
}

// describe is the schedule in one line.
func (s Schedule) describe() string {
	switch s.Local {
	case localpace.KindAWS:
		return "AWS SDK adaptive mode per process (token bucket + CUBIC over the measured rate, β 0.7, C 0.4), capped at ceiling ÷ processes"
	case localpace.KindOracle:
		return fmt.Sprintf("every process at %.2f × allowance ÷ processes, in turn, no adaptation (the physical reference)", OracleShare)
	}
	if s.Adapt == sources.AdaptEstimate {
		return fmt.Sprintf("--adapt estimate, headers %v, respace %v", s.Headers, s.Respace)
	}
	return fmt.Sprintf("--adapt multiplier ×%g, ÷%g per %d clean, probe %v, headers %v, respace %v",
		s.Backoff, s.Recovery, s.DecayAfter, s.Probe, s.Headers, s.Respace)
}

// platform is the schedule's sources.Platform at the ceiling.
func (s Schedule) platform(name string, ceiling float64) sources.Platform {
	p := sources.Platform{Name: name, RatePerSec: ceiling, Burst: 1}
	if s.Local != "" {
		return p
	}
	p.Adapt, p.BackoffFactor, p.RecoveryFactor, p.DecayAfter = s.Adapt, s.Backoff, s.Recovery, s.DecayAfter
	p.NoProbe, p.NoUseHeaders, p.NoRespace = !s.Probe, !s.Headers, !s.Respace
	return p
}

// localPacer is the worker flag's value that paces a cell of a local
// schedule in process i of workers (none for the shared pacer's
// schedules): aws capped at the process's share of the ceiling; the oracle
// at its share of the allowance, changing at the model's steps (instants by
// the wall clock, from start, in a run of length d), its slots in turn
// with the other processes' (phase i/workers).
func (c cell) localPacer(ceiling float64, workers, i int, start time.Time, d time.Duration) string {
	n := float64(workers)
	switch c.schedule.Local {
	case localpace.KindAWS:
		return localpace.Spec{Platform: c.platform, Kind: localpace.KindAWS, Steps: []localpace.Step{{Rate: ceiling / n}}}.String()
	case localpace.KindOracle:
		sp := localpace.Spec{Platform: c.platform, Kind: localpace.KindOracle,
			Steps: []localpace.Step{{Rate: c.model.allowance(ceiling, 0, d) * OracleShare / n}}, Phase: float64(i) / n}
		for _, st := range c.model.Steps {
			at := stepAt(st, d)
			sp.Steps = append(sp.Steps, localpace.Step{From: start.Add(at), Rate: c.model.allowance(ceiling, at, d) * OracleShare / n})
		}
		return sp.String()
	}
	return ""
}
