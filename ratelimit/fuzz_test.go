package ratelimit

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

// headerFromText turns "Name: value" lines into a header, for fuzzing: the
// fuzzer then explores names, repetitions and values together.
func headerFromText(raw string) http.Header {
	h := http.Header{}
	for line := range strings.SplitSeq(raw, "\n") {
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		h.Add(strings.TrimSpace(name), strings.TrimLeft(value, " "))
	}
	return h
}

// FuzzParse: whatever the header and the clock, Parse returns within its
// invariants (checkInvariants) and agrees with ParseRetryAfter.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"RateLimit-Policy: \"default\";q=100;w=60\nRateLimit: \"default\";r=50;t=30",
		"RateLimit-Policy: \"burst\";q=100;w=60, \"daily\";q=1000;w=86400\nRateLimit: \"burst\";r=80;t=40, \"daily\";r=2;t=3600",
		"RateLimit-Limit: 100, 100;w=60\nRateLimit-Remaining: 50\nRateLimit-Reset: 30",
		"RateLimit: limit=10, remaining=4, reset=3\nRateLimit-Policy: 10;w=1",
		"X-RateLimit-Limit: 5000\nX-RateLimit-Remaining: 0\nX-RateLimit-Reset: 1780380000",
		"X-RateLimit-Limit: 1\nX-RateLimit-Remaining: 0\nX-RateLimit-Reset: 0.125",
		"X-Rate-Limit-Remaining: 3\nX-RateLimit-Reset-After: 1.25",
		"Retry-After: 99999999999999999999\nX-RateLimit-Reset: -5",
		"Retry-After: Fri, 31 Dec 9999 23:59:59 GMT",
		"RateLimit: \"x\";r=1e9;t=NaN, (1 2);r=3, ?1, :AAA=:;r=0",
		"X-RateLimit-Reset: Fri, 31 Dec 9999 23:59:59 GMT",
	} {
		f.Add(seed, int64(1780380000))
	}
	f.Fuzz(func(t *testing.T, raw string, nowSecs int64) {
		now := time.Unix(nowSecs, 0)
		h := headerFromText(raw)
		info := Parse(h, now)
		checkInvariants(t, info)
		if vs := h.Values("Retry-After"); len(vs) > 0 {
			d, ok := ParseRetryAfter(vs[0], now)
			if d != info.RetryAfter || ok != info.HasRetryAfter {
				t.Fatalf("Retry-After %q: Parse %v %v, ParseRetryAfter %v %v", vs[0], info.RetryAfter, info.HasRetryAfter, d, ok)
			}
		}
		if r, ok := info.Rate(); ok && (r <= 0 || math.IsInf(r, 0)) {
			t.Fatalf("Rate %v", r)
		}
	})
}

// FuzzParseRetryAfter: never negative, never above MaxWait, 0 when not ok;
// digit strings are always ok and monotonic in their value.
func FuzzParseRetryAfter(f *testing.F) {
	for _, seed := range []string{
		"120", "0", "86400", "99999999999999999999", "-5", "1.5", "+5", " 30 ",
		"Wed, 21 Oct 2015 07:28:00 GMT", "Wednesday, 21-Oct-15 07:29:00 GMT",
		"Wed Oct 21 08:28:00 2015", "Fri, 31 Dec 9999 23:59:59 GMT", "\xff\xfe", "",
	} {
		f.Add(seed, int64(1445412480))
	}
	f.Fuzz(func(t *testing.T, value string, nowSecs int64) {
		d, ok := ParseRetryAfter(value, time.Unix(nowSecs, 0))
		if d < 0 || d > MaxWait {
			t.Fatalf("ParseRetryAfter(%q) = %v, outside [0, %v]", value, d, MaxWait)
		}
		if !ok && d != 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v with ok false", value, d)
		}
		if v := strings.Trim(value, " \t"); isDigits(v) {
			if !ok {
				t.Fatalf("ParseRetryAfter(%q): digits not ok", value)
			}
			if d2, _ := ParseRetryAfter(v+"0", time.Time{}); d2 < d {
				t.Fatalf("ParseRetryAfter(%q0) = %v < ParseRetryAfter(%q) = %v", v, d2, v, d)
			}
		}
	})
}
