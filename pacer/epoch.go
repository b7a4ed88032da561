package pacer

import (
	"math"
	"time"
)

// Times in the database are epoch seconds (float8). Every conversion to Go
// saturates: a value from the database or a destination (a hold of
// 'Infinity' for an open-ended pause, a Retry-After of 10^20 seconds) can
// never overflow a time.Duration or a time.Time.

// maxSeconds is the largest duration, in seconds, that converts exactly.
const maxSeconds = float64(math.MaxInt64) / float64(time.Second)

// secondsToDuration converts seconds to a Duration, saturating at the
// largest and smallest Durations; NaN is 0.
func secondsToDuration(s float64) time.Duration {
	switch {
	case math.IsNaN(s):
		return 0
	case s >= maxSeconds:
		return math.MaxInt64
	case s <= -maxSeconds:
		return math.MinInt64
	}
	return time.Duration(math.Round(s * float64(time.Second)))
}

// clampDuration limits d to [0, MaxHold].
func clampDuration(d time.Duration) time.Duration {
	return min(max(d, 0), MaxHold)
}

// epochToTime converts epoch seconds to a time; infinity and values beyond
// year 9999 become farFuture. (time.Time.Sub saturates, so durations
// computed from it cannot overflow either.)
func epochToTime(s float64) time.Time {
	switch {
	case math.IsNaN(s):
		return time.Time{}
	case s >= farFutureEpoch:
		return farFuture
	case s <= 0:
		return time.Unix(0, 0)
	}
	sec, frac := math.Modf(s)
	return time.Unix(int64(sec), int64(math.Round(frac*1e9)))
}

// farFuture stands for "never" (an open-ended pause).
var farFuture = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

var farFutureEpoch = float64(farFuture.Unix())

func timeToEpoch(t time.Time) float64 {
	return float64(t.Unix()) + float64(t.Nanosecond())/1e9
}

func maxTime(t time.Time, ts ...time.Time) time.Time {
	for _, u := range ts {
		if u.After(t) {
			t = u
		}
	}
	return t
}
