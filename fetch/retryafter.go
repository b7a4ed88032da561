package fetch

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ParseRetryAfter parses a Retry-After header value in either form: delta
// seconds ("120") or an HTTP-date ("Wed, 21 Oct 2015 07:28:00 GMT", and the
// obsolete RFC 850 and asctime forms), the latter relative to now.
//
// ok is false for an empty or malformed value (including negative or
// fractional seconds); the duration is then 0. A date in the past is valid
// and yields 0. An absurdly large number of seconds is clamped to the largest
// Duration rather than rejected: the destination clearly means "a long time".
func ParseRetryAfter(value string, now time.Time) (d time.Duration, ok bool) {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0, false
	}
	if isDigits(value) {
		secs, err := strconv.ParseInt(value, 10, 64)
		if err != nil || secs > int64(math.MaxInt64/time.Second) {
			// Only overflow gets here: the value is all digits.
			return time.Duration(math.MaxInt64), true
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(value)
	if err != nil {
		return 0, false
	}
	d = t.Sub(now)
	if d < 0 {
		d = 0
	}
	return d, true
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
