package status

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/sources"
)

// What a platform is doing, named for what it is (Condition.Kind).
const (
	KindPaused      = "paused"       // an operator paused it
	KindCoolingDown = "cooling_down" // it said stop: nothing is sent until the cooldown ends
	KindHolding     = "holding"      // a fleet-wide hold: a Retry-After, an exhausted quota
	KindThrottled   = "throttled"    // adaptation slows it below its ceiling ('multiplier' adaptation)
	KindBackingOff  = "backing_off"  // adaptation paces it just under the limit the fleet measured ('estimate')
	KindAnnounced   = "announced"    // paced by the rate the destination's headers announce
	KindWindow      = "window"       // paced by a fixed window learned from the destination's refusals
	KindRefused     = "refused"      // 429 or 503 answers in the last minute
	KindWaiting     = "waiting"      // requests in flight and none answered in the last minute: the destination hangs
	KindRunning     = "running"      // at its configured pace, nothing refused
)

// How much a condition holds a platform back (Condition.Level), for
// colours: stopped (nothing is sent), slowed (less than the ceiling, or
// answers refused), ok.
const (
	LevelStopped = "stopped"
	LevelSlowed  = "slowed"
	LevelOK      = "ok"
)

// Condition is one thing a platform is doing now, in words, as status,
// `sources show` and the dashboard show it: "paused by operator",
// "cooling down: max multiplier reached", "holding for Retry-After",
// "throttled ×5.1", "backing off: estimate 9.6/s", "429s: 12 in the last
// minute", "running". Detail says in fleetpace's words why, or which rule
// applied ("a 10s Retry-After came while the platform was paced as slowly
// as it may be → the platform's 15m cooldown"); Reason is what came from
// outside: the operator's reason for a pause, the destination's answer
// that started a cooldown or a hold (show it as such: escaped, isolated).
type Condition struct {
	Kind   string
	Level  string
	Text   string
	Detail string
	Reason string
	// Left is how long it still lasts (a pause, a cooldown, a hold; 0:
	// until something changes, or until resumed).
	Left time.Duration
}

// String is the condition on one line: its text and the time left.
func (c Condition) String() string {
	if c.Left > 0 {
		return c.Text + ", " + shortDur(c.Left) + " left"
	}
	return c.Text
}

type conditionJSON struct {
	Kind   string  `json:"kind"`
	Level  string  `json:"level"`
	Text   string  `json:"text"`
	Detail string  `json:"detail,omitempty"`
	Reason string  `json:"reason,omitempty"`
	Left   float64 `json:"left_s,omitempty"`
}

// MarshalJSON writes Left in seconds, under a key that says so.
func (c Condition) MarshalJSON() ([]byte, error) {
	return json.Marshal(conditionJSON{c.Kind, c.Level, c.Text, c.Detail, c.Reason, c.Left.Seconds()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (c *Condition) UnmarshalJSON(b []byte) error {
	var j conditionJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*c = Condition{j.Kind, j.Level, j.Text, j.Detail, j.Reason, time.Duration(j.Left * float64(time.Second))}
	return nil
}

// Conditions says what a platform is doing now, most constraining first:
// a pause, a cooldown (with the rule that set its length) or else a hold,
// adaptation's slow-down (throttled, backing off) or the destination's
// announced rate, and 429/503 answers in the recent window; "running"
// when none of these is so. Every answer refused shows, between holds
// too: a platform answered 429 steadily is never "running"; and requests
// in flight (inFlight, fleet-wide) with none answered in the recent
// window show as waiting: a destination that hangs.
func Conditions(p sources.Platform, pace pacer.State, cd *sources.Cooldown, recent Recent, inFlight int) []Condition {
	var out []Condition
	switch {
	case pace.PausedIndefinitely:
		out = append(out, Condition{Kind: KindPaused, Level: LevelStopped, Text: "paused by operator until resumed", Reason: pace.PauseReason})
	case pace.Paused > 0:
		out = append(out, Condition{Kind: KindPaused, Level: LevelStopped, Text: "paused by operator", Reason: pace.PauseReason, Left: pace.Paused})
	}
	switch {
	case cd != nil:
		out = append(out, Condition{Kind: KindCoolingDown, Level: LevelStopped, Text: "cooling down: " + cd.Headline(),
			Detail: cd.Rule(p.Cooldown), Reason: cd.Reason, Left: cd.Remaining})
	case pace.Hold > 0:
		c := Condition{Kind: KindHolding, Level: LevelStopped, Text: "holding",
			Detail: "the destination asked the fleet to wait: no request leaves for it from any worker until the hold ends", Left: pace.Hold}
		switch pace.HoldReason {
		case "Retry-After":
			c.Text = "holding for Retry-After"
		case "quota exhausted":
			c.Text = "holding: quota exhausted"
		default:
			c.Reason = pace.HoldReason
		}
		out = append(out, c)
	}
	switch {
	case pace.PacedBy == pacer.PacedByAnnounced:
		out = append(out, Condition{Kind: KindAnnounced, Level: LevelSlowed, Text: "paced by the destination: " + perSec(pace.AnnouncedRate) + " announced",
			Detail: fmt.Sprintf("its rate-limit headers allow %s for %s more (ceiling %s)", perSec(pace.AnnouncedRate), shortDur(pace.AnnouncedFor), perSec(pace.Rate)), Left: pace.AnnouncedFor})
	case pace.PacedBy == pacer.PacedByWindow:
		out = append(out, Condition{Kind: KindWindow, Level: LevelSlowed, Text: fmt.Sprintf("paced by a window: %d per %s", pace.WindowQuota, shortDur(pace.Window)),
			Detail: fmt.Sprintf("the destination's refusals reset on a fixed grid of %s: the fleet sends %d requests in each window at the ceiling (%s), then waits for the next (%s in the long run)",
				shortDur(pace.Window), pace.WindowQuota, perSec(pace.Rate), perSec(pace.EffectiveRate))})
	case pace.Multiplier > 1.0001 && pace.Adapt == sources.AdaptEstimate && pace.Estimate > 0:
		out = append(out, Condition{Kind: KindBackingOff, Level: LevelSlowed, Text: "backing off: estimate " + perSec(pace.Estimate),
			Detail: fmt.Sprintf("the destination refused requests; the fleet measured it accepts about %s and paces just under it (%s of the %s ceiling), recovering by itself as answers come back clean",
				perSec(pace.Estimate), perSec(pace.Rate/pace.Multiplier), perSec(pace.Rate))})
	case pace.Multiplier > 1.0001:
		out = append(out, Condition{Kind: KindThrottled, Level: LevelSlowed, Text: "throttled " + multiplier(pace.Multiplier),
			Detail: fmt.Sprintf("the destination refused requests; the fleet paces at the ceiling ÷ %s (%s of %s), at most ÷ %s, and recovers by itself as answers come back clean",
				strconv.FormatFloat(pace.Multiplier, 'g', 3, 64), perSec(pace.Rate/pace.Multiplier), perSec(pace.Rate), strconv.FormatFloat(pace.MaxMultiplier, 'g', 3, 64))})
	}
	if inFlight > 0 && recent.Total() == 0 {
		out = append(out, Condition{Kind: KindWaiting, Level: LevelSlowed, Text: fmt.Sprintf("waiting: %d request(s) in flight, none answered in the last %s", inFlight, windowText(recent.Window)),
			Detail: "the destination takes long to answer, or hangs: the requests wait until the fetch timeout"})
	}
	if n := recent.Refused(); n > 0 {
		out = append(out, Condition{Kind: KindRefused, Level: LevelSlowed, Text: fmt.Sprintf("429s: %d in the last %s", n, windowText(recent.Window)),
			Detail: "the destination answered 429 or 503 (rate limited); see the reasons in the fetch history"})
	}
	if len(out) == 0 {
		out = append(out, Condition{Kind: KindRunning, Level: LevelOK, Text: "running"})
	}
	return out
}

// Level is the most constraining level of cs (LevelOK when empty).
func Level(cs []Condition) string {
	level := LevelOK
	for _, c := range cs {
		switch c.Level {
		case LevelStopped:
			return LevelStopped
		case LevelSlowed:
			level = LevelSlowed
		}
	}
	return level
}

// Usage is how much of its pace a platform used recently: the fetches per
// second delivered over the recent window against the rate the fleet
// paces it at now and its ceiling, the 429/503 answers per minute, and
// the fetches in flight fleet-wide.
type Usage struct {
	UsedPerSec      float64 `json:"used_per_sec"`      // fetches/s over the recent window, every outcome
	EffectivePerSec float64 `json:"effective_per_sec"` // the pace now (0 while paused or held)
	CeilingPerSec   float64 `json:"ceiling_per_sec"`
	RefusedPerMin   float64 `json:"refused_429_per_min"` // 429 and 503 answers per minute over the recent window
	InFlight        int     `json:"in_flight"`           // fetches sent and not answered yet, every live worker together
}

// Of is the platform's usage from its pace, recent fetches and fetches in
// flight.
func UsageOf(pace pacer.State, recent Recent, inFlight int) Usage {
	eff := pace.EffectiveRate
	if pace.PacedBy == pacer.PacedByPause || pace.PacedBy == pacer.PacedByHold {
		eff = 0
	}
	u := Usage{UsedPerSec: recent.PerSec(), EffectivePerSec: eff, CeilingPerSec: pace.Rate, InFlight: inFlight}
	if recent.Window > 0 {
		u.RefusedPerMin = float64(recent.Refused()) / recent.Window.Minutes()
	}
	return u
}

// Text is "x of y/s": the rate used over the rate the fleet paces at now,
// and the ceiling when that is less: "4.2 of 7/s", "1.1 of 1.4/s (ceiling
// 7/s)".
func (u Usage) Text() string {
	s := num(u.UsedPerSec) + " of " + perSec(u.EffectivePerSec)
	if u.EffectivePerSec < u.CeilingPerSec*0.999 {
		s += " (ceiling " + perSec(u.CeilingPerSec) + ")"
	}
	return s
}

// Refused counts the window's 429 and 503 answers (outcomes rate_pressure
// and rate_limited).
func (r Recent) Refused() int64 {
	return r.Checks[fetch.RatePressure] + r.Checks[fetch.RateLimited]
}

func num(f float64) string {
	if f >= 100 {
		return strconv.FormatFloat(f, 'f', 0, 64)
	}
	return strconv.FormatFloat(f, 'g', 2, 64)
}

func perSec(f float64) string { return num(f) + "/s" }

func multiplier(f float64) string { return "×" + strconv.FormatFloat(f, 'f', 1, 64) }

func windowText(d time.Duration) string {
	if d == time.Minute {
		return "minute"
	}
	return shortDur(d)
}

func shortDur(d time.Duration) string { return sources.HumanDuration(d) }
