package bench

import (
	"sort"
	"time"

	"github.com/fleetpace/fleetpace/internal/fakedest"
)

// arrival is one request as its destination saw it.
type arrival struct {
	At      time.Time
	Status  int
	Limited bool // refused by the limiter (429)
	// RetryAfter is the Retry-After the refusal sent; 0: none.
	RetryAfter time.Duration
}

func (a arrival) ok() bool { return a.Status >= 200 && a.Status < 400 }

// Figures of the analysis.
const (
	adaptEarlyFrom     = 10 * time.Second // goodput over seconds 10–70
	adaptEarlyTo       = 70 * time.Second
	adaptReachSpan     = 5 * time.Second // goodput held ≥ adaptReachGoodput this long
	adaptReachGoodput  = 0.85
	adaptDropQuietSpan = 10 * time.Second
)

// RunFigures are one cell's figures from one run.
type RunFigures struct {
	// Goodput1070 is requests accepted over seconds 10–70 of the run (10 to
	// the end in a shorter one) over what the destination allowed then;
	// GoodputHalf the same over the last half (for a window longer than
	// 1 s, its whole windows in the last half).
	Goodput1070 float64 `json:"goodput_10_70"`
	GoodputHalf float64 `json:"goodput_last_half"`
	// Goodput10End is the same over seconds 10 to the end: a 10-minute
	// run's figure.
	Goodput10End float64 `json:"goodput_10_end"`
	// Limited10End and LimitedHalf are the shares of requests refused
	// (429) from second 10 to the end and in the last half.
	Limited10End float64 `json:"limited_share_10_end"`
	LimitedHalf  float64 `json:"limited_share_last_half"`
	// Reach is the start, in seconds from the run's start, of the first
	// 5-s span (a window's length, if longer) with goodput ≥ 0.85; -1:
	// none.
	Reach float64 `json:"reach_085_s"`
	// MaxWindow is the largest number of requests in any 1-s window of the
	// run (never above the ceiling + burst).
	MaxWindow int `json:"max_1s_window"`
	// Rise (rise models) is the start, in seconds after the limit rose, of
	// the first 5-s span with goodput ≥ 0.85 × the new limit; -1: none.
	Rise float64 `json:"rise_085_s,omitempty"`
	// DropStop (drop models) is how long after the drop the 429s stopped:
	// the start of the first 10-s span without one; -1: they did not.
	DropStop float64 `json:"drop_429s_stop_s,omitempty"`
	// OldSpacing is how many requests reached the destination between the
	// first 429 of the run and the end of its Retry-After (1 s without
	// one): requests sent at the old spacing; -1: no 429.
	OldSpacing float64 `json:"old_spacing_requests"`
}

// analyze computes one cell's figures from what its destination recorded
// of a run that started at start and lasted d, at ceiling c.
func analyze(m Model, reqs []arrival, start time.Time, d time.Duration, c float64) RunFigures {
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].At.Before(reqs[j].At) })
	f := RunFigures{Reach: -1, OldSpacing: -1}
	at := func(off time.Duration) time.Time { return start.Add(off) }

	// Goodput and 429 share over seconds 10–70, 10–end and the last half.
	early := min(adaptEarlyTo, d)
	f.Goodput1070, _ = goodput(m, reqs, start, d, c, at(adaptEarlyFrom), at(early))
	f.Goodput10End, f.Limited10End = goodput(m, reqs, start, d, c, at(adaptEarlyFrom), at(d))
	from, to := at(d/2), at(d)
	if w := m.Window; w > time.Second {
		// The whole windows of the last half; at least the run's last one.
		from, to = from.Add(w-1).Truncate(w), to.Truncate(w)
		if !from.Before(to) {
			from = to.Add(-w)
		}
	}
	f.GoodputHalf, f.LimitedHalf = goodput(m, reqs, start, d, c, from, to)

	var times []time.Time
	for _, r := range reqs {
		times = append(times, r.At)
	}
	f.MaxWindow = fakedest.MaxInWindow(times, time.Second)

	span := max(adaptReachSpan, m.Window)
	f.Reach = reach(m, reqs, start, d, c, 0, span)
	if len(m.Steps) > 0 {
		change := stepAt(m.Steps[0], d)
		end := d
		if len(m.Steps) > 1 {
			end = stepAt(m.Steps[1], d)
		}
		switch m.Figure {
		case FigureRise:
			f.Rise = -1
			if r := reach(m, reqs, start, end, c, change, span); r >= 0 {
				f.Rise = r - change.Seconds()
			}
		case FigureDrop:
			f.DropStop = dropStop(reqs, at(change), at(end))
		}
	}
	f.OldSpacing = oldSpacing(reqs)
	return f
}

// goodput is accepted requests in [from, to) over the allowance then, and
// the share of requests refused.
func goodput(m Model, reqs []arrival, start time.Time, d time.Duration, c float64, from, to time.Time) (good, limitedShare float64) {
	allowed := 0.0
	const step = 100 * time.Millisecond
	for t := from; t.Before(to); t = t.Add(step) {
		allowed += m.allowance(c, t.Sub(start), d) * min(step, to.Sub(t)).Seconds()
	}
	var accepted, limited, total int
	for _, r := range reqs {
		if r.At.Before(from) || !r.At.Before(to) {
			continue
		}
		total++
		if r.Limited {
			limited++
		} else if r.ok() {
			accepted++
		}
	}
	if allowed > 0 {
		good = float64(accepted) / allowed
	}
	if total > 0 {
		limitedShare = float64(limited) / float64(total)
	}
	return good, limitedShare
}

// reach is the start (seconds from the run's start) of the first span of
// length span starting at or after from (in 1-s steps) that ends by end
// and has goodput ≥ 0.85; -1 if none.
func reach(m Model, reqs []arrival, start time.Time, end time.Duration, c float64, from, span time.Duration) float64 {
	for k := from; k+span <= end; k += time.Second {
		if g, _ := goodput(m, reqs, start, end, c, start.Add(k), start.Add(k+span)); g >= adaptReachGoodput {
			return k.Seconds()
		}
	}
	return -1
}

// dropStop is the time from drop until the start of the first 10-s span
// without a 429 ending by end (0 if none came after the drop); -1 if
// there is none.
func dropStop(reqs []arrival, drop, end time.Time) float64 {
	last := drop
	for _, r := range reqs {
		if !r.Limited || r.At.Before(drop) || !r.At.Before(end) {
			continue
		}
		if r.At.Sub(last) >= adaptDropQuietSpan {
			break
		}
		last = r.At
	}
	if end.Sub(last) < adaptDropQuietSpan {
		return -1
	}
	return last.Sub(drop).Seconds()
}

// oldSpacing counts the arrivals after the first 429 within the
// Retry-After it sent (1 s if none).
func oldSpacing(reqs []arrival) float64 {
	for i, r := range reqs {
		if !r.Limited {
			continue
		}
		ra := r.RetryAfter
		if ra <= 0 {
			ra = time.Second
		}
		n := 0
		for _, q := range reqs[i+1:] {
			if q.At.Sub(r.At) >= ra {
				break
			}
			n++
		}
		return float64(n)
	}
	return -1
}
