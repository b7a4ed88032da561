package fetch

import (
	"math"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2015, 10, 21, 7, 28, 0, 0, time.UTC)
	tests := []struct {
		value  string
		want   time.Duration
		wantOK bool
	}{
		{"120", 2 * time.Minute, true},
		{"0", 0, true},
		{"  30  ", 30 * time.Second, true},
		{"007", 7 * time.Second, true},
		{"86400", 24 * time.Hour, true},
		{"99999999999999999999", time.Duration(math.MaxInt64), true},
		{"9223372036", 9223372036 * time.Second, true},
		{"9223372037", time.Duration(math.MaxInt64), true},
		{"", 0, false},
		{"   ", 0, false},
		{"-5", 0, false},
		{"+5", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
		{"120s", 0, false},
		{"Wed, 21 Oct 2015 07:30:00 GMT", 2 * time.Minute, true}, // IMF-fixdate
		{"Wednesday, 21-Oct-15 07:29:00 GMT", time.Minute, true}, // RFC 850
		{"Wed Oct 21 08:28:00 2015", time.Hour, true},            // asctime
		{"Wed, 21 Oct 2015 07:28:00 GMT", 0, true},               // now
		{"Wed, 21 Oct 2015 06:00:00 GMT", 0, true},               // past
		{"Wed, 21 Oct 2015 07:30:00", 0, false},                  // no zone
		{"2015-10-21T07:30:00Z", 0, false},                       // not an HTTP-date
	}
	for _, tt := range tests {
		got, ok := ParseRetryAfter(tt.value, now)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.value, got, ok, tt.want, tt.wantOK)
		}
	}
}
