package ratelimit

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2026, 6, 2, 6, 0, 0, 0, time.UTC)

// hdr builds a header from name, value pairs; a name may repeat.
func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func epochIn(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }

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
		{"000", 0, true},
		{"  30  ", 30 * time.Second, true},
		{"\t30", 30 * time.Second, true},
		{"007", 7 * time.Second, true},
		{"86399", 86399 * time.Second, true},
		{"86400", MaxWait, true},
		{"86401", MaxWait, true},
		{"99999", MaxWait, true},
		{"9223372036", MaxWait, true},
		{"9223372037", MaxWait, true},                         // overflows Duration as seconds
		{"99999999999999999999", MaxWait, true},               // overflows int64
		{strings.Repeat("9", 1<<20), MaxWait, true},           // 1 MiB of digits
		{"0000000000000000000000042", 42 * time.Second, true}, // leading zeros are not magnitude
		{"", 0, false},
		{"   ", 0, false},
		{"-5", 0, false},
		{"-99999999999999999999", 0, false},
		{"+5", 0, false},
		{"1.5", 0, false},
		{"0.5", 0, false},
		{"1e3", 0, false},
		{"NaN", 0, false},
		{"Inf", 0, false},
		{"soon", 0, false},
		{"120s", 0, false},
		{"12 0", 0, false},
		{"\xff\xfe", 0, false},
		{"1\x00", 0, false},
		{strings.Repeat("x", 1<<20), 0, false},
		{"Wed, 21 Oct 2015 07:30:00 GMT", 2 * time.Minute, true}, // IMF-fixdate
		{"Wednesday, 21-Oct-15 07:29:00 GMT", time.Minute, true}, // RFC 850
		{"Wed Oct 21 08:28:00 2015", time.Hour, true},            // asctime
		{"Wed, 21 Oct 2015 07:28:00 GMT", 0, true},               // now
		{"Wed, 21 Oct 2015 06:00:00 GMT", 0, true},               // past
		{"Mon, 01 Jan 0001 00:00:00 GMT", 0, true},               // distant past
		{"Fri, 31 Dec 9999 23:59:59 GMT", MaxWait, true},         // year 9999
		{"Thu, 22 Oct 2015 07:28:00 GMT", MaxWait, true},         // exactly a day
		{"Thu, 22 Oct 2015 07:27:59 GMT", MaxWait - time.Second, true},
		{"Wed, 21 Oct 2015 07:30:00", 0, false},     // no zone
		{"2015-10-21T07:30:00Z", 0, false},          // not an HTTP-date
		{"Wed, 32 Oct 2015 07:30:00 GMT", 0, false}, // no such day
	}
	for _, tt := range tests {
		got, ok := ParseRetryAfter(tt.value, now)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("ParseRetryAfter(%.40q) = %v, %v; want %v, %v", tt.value, got, ok, tt.want, tt.wantOK)
		}
	}
	// Extreme clocks: Time.Sub saturates, the cap holds.
	for _, n := range []time.Time{time.Unix(math.MinInt64/2, 0), time.Unix(math.MaxInt64/2, 0), {}} {
		if d, ok := ParseRetryAfter("Fri, 31 Dec 9999 23:59:59 GMT", n); !ok || d < 0 || d > MaxWait {
			t.Errorf("ParseRetryAfter(year 9999, now %v) = %v, %v", n, d, ok)
		}
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		h    http.Header
		want Info
	}{
		{"nothing", hdr("Content-Type", "text/plain"), Info{}},
		{"retry-after only", hdr("Retry-After", "5"), Info{RetryAfter: 5 * time.Second, HasRetryAfter: true}},
		{"retry-after: first line wins", hdr("Retry-After", "5", "Retry-After", "500"), Info{RetryAfter: 5 * time.Second, HasRetryAfter: true}},

		// IETF structured fields (current draft).
		{"ietf: one policy",
			hdr("RateLimit-Policy", `"default";q=100;w=60`, "RateLimit", `"default";r=50;t=30`),
			Info{Limit: 100, Window: time.Minute, Remaining: 50, HasRemaining: true, Reset: 30 * time.Second, HasReset: true, Form: IETF}},
		{"ietf: token names, upper-case keys, spaces after ;",
			hdr("RateLimit-Policy", `default; Q=10; W=1`, "RateLimit", `default;R=3;T=1`),
			Info{Limit: 10, Window: time.Second, Remaining: 3, HasRemaining: true, Reset: time.Second, HasReset: true, Form: IETF}},
		{"ietf: several policies, least remaining wins, its own quota",
			hdr("RateLimit-Policy", `"burst";q=100;w=60, "daily";q=1000;w=86400`,
				"RateLimit", `"burst";r=80;t=40, "daily";r=2;t=3600`),
			Info{Limit: 1000, Window: 24 * time.Hour, Remaining: 2, HasRemaining: true, Reset: time.Hour, HasReset: true, Form: IETF}},
		{"ietf: policies on separate lines",
			hdr("RateLimit-Policy", `"a";q=100;w=60`, "RateLimit-Policy", `"b";q=10;w=1`,
				"RateLimit", `"a";r=90;t=10`, "RateLimit", `"b";r=0;t=1`),
			Info{Limit: 10, Window: time.Second, Remaining: 0, HasRemaining: true, Reset: time.Second, HasReset: true, Form: IETF}},
		{"ietf: equal remaining, later reset wins",
			hdr("RateLimit-Policy", `"a";q=5;w=1, "b";q=50;w=60`, "RateLimit", `"a";r=0;t=1, "b";r=0;t=45`),
			Info{Limit: 50, Window: time.Minute, Remaining: 0, HasRemaining: true, Reset: 45 * time.Second, HasReset: true, Form: IETF}},
		{"ietf: one each, names differ: still paired",
			hdr("RateLimit-Policy", `"p";q=20;w=10`, "RateLimit", `"other";r=4;t=2`),
			Info{Limit: 20, Window: 10 * time.Second, Remaining: 4, HasRemaining: true, Reset: 2 * time.Second, HasReset: true, Form: IETF}},
		{"ietf: unmatched name among several policies: no quota",
			hdr("RateLimit-Policy", `"a";q=20;w=10, "b";q=5;w=1`, "RateLimit", `"c";r=4;t=2`),
			Info{Remaining: 4, HasRemaining: true, Reset: 2 * time.Second, HasReset: true, Form: IETF}},
		{"ietf: remaining without t",
			hdr("RateLimit", `"x";r=7`),
			Info{Remaining: 7, HasRemaining: true, Form: IETF}},
		{"ietf: policy only, lowest rate wins",
			hdr("RateLimit-Policy", `"minute";q=600;w=60, "second";q=5;w=1, "hour";q=3600;w=3600`),
			Info{Limit: 3600, Window: time.Hour, Form: IETF}}, // 3600/3600 s = 1/s < 5/s < 10/s
		{"ietf: partition key and quota unit ignored",
			hdr("RateLimit-Policy", `"p";q=10;w=1;qu="requests";pk=:cHJvamVjdDEyMw==:`, "RateLimit", `"p";r=9;t=1;pk=:cHJvamVjdDEyMw==:`),
			Info{Limit: 10, Window: time.Second, Remaining: 9, HasRemaining: true, Reset: time.Second, HasReset: true, Form: IETF}},
		{"ietf: monthly window scaled to a day",
			hdr("RateLimit-Policy", `"month";q=2592000;w=2592000`),
			Info{Limit: 86400, Window: MaxWait, Form: IETF}},
		{"ietf: fractional remaining and reset",
			hdr("RateLimit", `"x";r=0.5;t=0.25`),
			Info{Remaining: 0.5, HasRemaining: true, Reset: 250 * time.Millisecond, HasReset: true, Form: IETF}},
		{"ietf: garbled member skipped, good one kept",
			hdr("RateLimit", `"bad" r=1, 5 5;r=0, "x";r=3;t=2`),
			Info{Remaining: 3, HasRemaining: true, Reset: 2 * time.Second, HasReset: true, Form: IETF}},
		{"ietf: a comma inside a quoted name",
			hdr("RateLimit", `"a,b";r=1;t=1, "c,d" junk;r=0, "e";r=2`),
			Info{Remaining: 1, HasRemaining: true, Reset: time.Second, HasReset: true, Form: IETF}},
		{"ietf: inner list and booleans ignored",
			hdr("RateLimit", `(1 2);r=1, ?1;r=2, "x";r=3;t=1;flag`),
			Info{Remaining: 1, HasRemaining: true, Form: IETF}},
		{"ietf with retry-after",
			hdr("Retry-After", "7", "RateLimit", `"x";r=0;t=7`, "RateLimit-Policy", `"x";q=1;w=7`),
			Info{RetryAfter: 7 * time.Second, HasRetryAfter: true, Limit: 1, Window: 7 * time.Second, Remaining: 0, HasRemaining: true, Reset: 7 * time.Second, HasReset: true, Form: IETF}},

		// Older draft forms.
		{"draft: triple",
			hdr("RateLimit-Limit", "100", "RateLimit-Remaining", "50", "RateLimit-Reset", "30"),
			Info{Limit: 100, Remaining: 50, HasRemaining: true, Reset: 30 * time.Second, HasReset: true, Form: IETFDraft}},
		{"draft: limit with policies",
			hdr("RateLimit-Limit", "100, 100;w=60, 1000;w=3600", "RateLimit-Remaining", "1", "RateLimit-Reset", "2"),
			Info{Limit: 100, Window: time.Minute, Remaining: 1, HasRemaining: true, Reset: 2 * time.Second, HasReset: true, Form: IETFDraft}},
		{"draft: first member carries w",
			hdr("RateLimit-Limit", "10;w=1"),
			Info{Limit: 10, Window: time.Second, Form: IETFDraft}},
		{"draft: policy in RateLimit-Policy",
			hdr("RateLimit-Limit", "10", "RateLimit-Policy", "50;w=60, 10;w=1", "RateLimit-Remaining", "0", "RateLimit-Reset", "1"),
			Info{Limit: 10, Window: time.Second, Remaining: 0, HasRemaining: true, Reset: time.Second, HasReset: true, Form: IETFDraft}},
		{"draft: no policy with the limit's quota: no window",
			hdr("RateLimit-Limit", "10, 50;w=60"),
			Info{Limit: 10, Form: IETFDraft}},
		{"draft-07 dictionary",
			hdr("RateLimit", "limit=10, remaining=4, reset=3", "RateLimit-Policy", "10;w=1"),
			Info{Limit: 10, Window: time.Second, Remaining: 4, HasRemaining: true, Reset: 3 * time.Second, HasReset: true, Form: IETFDraft}},
		{"draft: epoch reset tolerated",
			hdr("RateLimit-Remaining", "0", "RateLimit-Reset", epochIn(90*time.Second)),
			Info{Remaining: 0, HasRemaining: true, Reset: 90 * time.Second, HasReset: true, Form: IETFDraft}},

		// X-RateLimit family.
		{"x: delta reset",
			hdr("X-RateLimit-Limit", "60", "X-RateLimit-Remaining", "59", "X-RateLimit-Reset", "60"),
			Info{Limit: 60, Remaining: 59, HasRemaining: true, Reset: time.Minute, HasReset: true, Form: XRateLimit}},
		{"x: epoch reset (GitHub)",
			hdr("X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", epochIn(25*time.Minute)),
			Info{Limit: 5000, Remaining: 0, HasRemaining: true, Reset: 25 * time.Minute, HasReset: true, Form: XRateLimit}},
		{"x: epoch reset in the past is 0",
			hdr("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", epochIn(-time.Hour)),
			Info{Remaining: 0, HasRemaining: true, Reset: 0, HasReset: true, Form: XRateLimit}},
		{"x: epoch milliseconds",
			hdr("X-RateLimit-Reset", strconv.FormatInt(now.Add(1500*time.Millisecond).UnixMilli(), 10)),
			Info{Reset: 1500 * time.Millisecond, HasReset: true, Form: XRateLimit}},
		{"x: fractional epoch",
			hdr("X-RateLimit-Reset", epochIn(2*time.Second)+".5"),
			Info{Reset: 2500 * time.Millisecond, HasReset: true, Form: XRateLimit}},
		{"x: fractional delta",
			hdr("X-RateLimit-Limit", "1", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "0.125"),
			Info{Limit: 1, Remaining: 0, HasRemaining: true, Reset: 125 * time.Millisecond, HasReset: true, Form: XRateLimit}},
		{"x: large delta, not near now as an epoch: capped",
			hdr("X-RateLimit-Reset", "1500000000"),
			Info{Reset: MaxWait, HasReset: true, Form: XRateLimit}},
		{"x: HTTP-date reset",
			hdr("X-RateLimit-Reset", now.Add(10*time.Second).Format(http.TimeFormat)),
			Info{Reset: 10 * time.Second, HasReset: true, Form: XRateLimit}},
		{"x: Reset-After (Discord)",
			hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "1.25"),
			Info{Limit: 5, Remaining: 0, HasRemaining: true, Reset: 1250 * time.Millisecond, HasReset: true, Form: XRateLimit}},
		{"x: Reset wins over Reset-After",
			hdr("X-RateLimit-Reset", "3", "X-RateLimit-Reset-After", "9"),
			Info{Reset: 3 * time.Second, HasReset: true, Form: XRateLimit}},
		{"x: X-Rate-Limit spelling (Twitter)",
			hdr("X-Rate-Limit-Limit", "15", "X-Rate-Limit-Remaining", "14", "X-Rate-Limit-Reset", epochIn(15*time.Minute)),
			Info{Limit: 15, Remaining: 14, HasRemaining: true, Reset: 15 * time.Minute, HasReset: true, Form: XRateLimit}},
		{"x: lower-case names",
			http.Header{"X-Ratelimit-Remaining": {"3"}},
			Info{Remaining: 3, HasRemaining: true, Form: XRateLimit}},
		{"x: folded duplicate",
			hdr("X-RateLimit-Remaining", "3, 3"),
			Info{Remaining: 3, HasRemaining: true, Form: XRateLimit}},
		{"x: limit with a window",
			hdr("X-RateLimit-Limit", "100;w=60"),
			Info{Limit: 100, Window: time.Minute, Form: XRateLimit}},

		// Precedence: one family, never mixed.
		{"ietf over draft over x",
			hdr("RateLimit", `"x";r=1;t=1`, "RateLimit-Remaining", "2", "X-RateLimit-Remaining", "3"),
			Info{Remaining: 1, HasRemaining: true, Reset: time.Second, HasReset: true, Form: IETF}},
		{"draft over x",
			hdr("RateLimit-Remaining", "2", "X-RateLimit-Remaining", "3", "X-RateLimit-Limit", "10"),
			Info{Remaining: 2, HasRemaining: true, Form: IETFDraft}},
		{"unusable ietf falls through to x",
			hdr("RateLimit", `garbage ((`, "X-RateLimit-Remaining", "3"),
			Info{Remaining: 3, HasRemaining: true, Form: XRateLimit}},
		{"a zero limit alone announces nothing",
			hdr("X-RateLimit-Limit", "0"),
			Info{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Parse(tt.h, now)
			if got != tt.want {
				t.Fatalf("Parse(%v)\n got %+v\nwant %+v", tt.h, got, tt.want)
			}
			checkInvariants(t, got)
		})
	}
}

// Hostile values: each must cap or be dropped, never panic, never break an
// invariant.
func TestParseHostile(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat("9", 1<<20)
	many := make([]string, 10000)
	for i := range many {
		many[i] = `"p` + strconv.Itoa(i) + `";r=` + strconv.Itoa(i) + ";t=1"
	}
	manyOnOneLine := strings.Join(many, ", ")
	tests := []struct {
		name string
		h    http.Header
		want Info
	}{
		{"negative remaining dropped", hdr("X-RateLimit-Remaining", "-1"), Info{}},
		{"negative reset dropped", hdr("X-RateLimit-Reset", "-30"), Info{}},
		{"negative r dropped", hdr("RateLimit", `"x";r=-5;t=3`), Info{}},
		{"negative t dropped, r kept", hdr("RateLimit", `"x";r=5;t=-3`), Info{Remaining: 5, HasRemaining: true, Form: IETF}},
		{"negative q dropped", hdr("RateLimit-Policy", `"x";q=-5;w=1`), Info{}},
		{"negative w: no window", hdr("RateLimit-Policy", `"x";q=5;w=-1`), Info{Limit: 5, Form: IETF}},
		{"zero w: no window", hdr("RateLimit-Policy", `"x";q=5;w=0`), Info{Limit: 5, Form: IETF}},
		{"NaN and Inf", hdr("X-RateLimit-Limit", "NaN", "X-RateLimit-Remaining", "Inf", "X-RateLimit-Reset", "+Inf"), Info{}},
		{"exponents", hdr("X-RateLimit-Remaining", "1e400", "X-RateLimit-Reset", "1e9"), Info{}},
		{"hex and signs", hdr("X-RateLimit-Remaining", "0x10", "X-RateLimit-Reset", "+5"), Info{}},
		{"garbage", hdr("X-RateLimit-Limit", "lots", "X-RateLimit-Remaining", "5 requests", "X-RateLimit-Reset", "soon"), Info{}},
		{"invalid UTF-8", hdr("X-RateLimit-Remaining", "\xff\xfe", "RateLimit", "\"\xff\";r=1"), Info{}},
		{"NUL", hdr("X-RateLimit-Remaining", "5\x00"), Info{}},
		{"overflowing counts saturate", hdr("X-RateLimit-Limit", "99999999999999999999", "X-RateLimit-Remaining", huge),
			Info{Limit: MaxCount, Remaining: MaxCount, HasRemaining: true, Form: XRateLimit}},
		{"overflowing reset caps", hdr("X-RateLimit-Reset", "99999999999999999999"), Info{Reset: MaxWait, HasReset: true, Form: XRateLimit}},
		{"1 MiB reset caps", hdr("X-RateLimit-Reset", huge), Info{Reset: MaxWait, HasReset: true, Form: XRateLimit}},
		{"1 MiB fraction", hdr("X-RateLimit-Reset", "0."+huge), Info{Reset: time.Second, HasReset: true, Form: XRateLimit}},
		{"overflowing ietf values", hdr("RateLimit", `"x";r=`+huge+`;t=`+huge, "RateLimit-Policy", `"x";q=`+huge+`;w=`+huge),
			Info{Limit: MaxCount * MaxWait.Seconds() / math.MaxFloat64, Window: MaxWait, Remaining: MaxCount, HasRemaining: true, Reset: MaxWait, HasReset: true, Form: IETF}},
		{"far-future date reset", hdr("X-RateLimit-Reset", "Fri, 31 Dec 9999 23:59:59 GMT"), Info{Reset: MaxWait, HasReset: true, Form: XRateLimit}},
		{"far-future epoch reset", hdr("X-RateLimit-Reset", "253402300799"), Info{Reset: MaxWait, HasReset: true, Form: XRateLimit}},
		{"year 9999 retry-after", hdr("Retry-After", "Fri, 31 Dec 9999 23:59:59 GMT"), Info{RetryAfter: MaxWait, HasRetryAfter: true}},
		{"overflowing retry-after", hdr("Retry-After", "99999999999999999999"), Info{RetryAfter: MaxWait, HasRetryAfter: true}},
		{"negative retry-after", hdr("Retry-After", "-1"), Info{}},
		{"fractional retry-after", hdr("Retry-After", "0.5"), Info{}},
		{"1 MiB garbage in every field", hdr("Retry-After", "x"+huge, "RateLimit", huge+"x", "RateLimit-Policy", "\""+huge,
			"RateLimit-Limit", "x"+huge, "X-RateLimit-Remaining", huge+"x"), Info{}},
		{"10000 policies on one line: field ignored", hdr("RateLimit", manyOnOneLine), Info{}},
		{"10000 lines: field ignored", hdr(repeatKV("RateLimit", many)...), Info{}},
		{"10000 repeated remaining lines: the first counts", hdr(repeatKV("X-RateLimit-Remaining", many[:0], "7")...),
			Info{Remaining: 7, HasRemaining: true, Form: XRateLimit}},
		{"32 policies are fine", hdr("RateLimit", strings.Join(many[:32], ",")), Info{Remaining: 0, HasRemaining: true, Reset: time.Second, HasReset: true, Form: IETF}},
		{"unterminated string", hdr("RateLimit", `"abc;r=1`), Info{}},
		{"escape at end", hdr("RateLimit", `"abc\`), Info{}},
		{"control in string", hdr("RateLimit", "\"a\x01b\";r=1"), Info{}},
		{"lone separators", hdr("RateLimit", ",,,;;;===", "RateLimit-Policy", ";w=1"), Info{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Parse(tt.h, now)
			if got != tt.want {
				t.Fatalf("Parse\n got %+v\nwant %+v", got, tt.want)
			}
			checkInvariants(t, got)
		})
	}
}

// repeatKV returns name, value pairs: one per value, then one per extra.
func repeatKV(name string, values []string, extra ...string) []string {
	var kv []string
	for _, v := range append(append([]string(nil), extra...), values...) {
		kv = append(kv, name, v)
	}
	for range 10000 - len(values) - len(extra) {
		kv = append(kv, name, "1")
	}
	return kv
}

func TestInfoHelpers(t *testing.T) {
	t.Parallel()
	i := Parse(hdr("RateLimit-Policy", `"x";q=10;w=2`, "RateLimit", `"x";r=0.5;t=1`), now)
	if r, ok := i.Rate(); !ok || r != 5 {
		t.Errorf("Rate = %v, %v; want 5/s", r, ok)
	}
	if !i.Exhausted() || !i.Announced() {
		t.Errorf("Exhausted %v Announced %v, want both", i.Exhausted(), i.Announced())
	}
	i = Parse(hdr("X-RateLimit-Remaining", "1"), now)
	if _, ok := i.Rate(); ok || i.Exhausted() {
		t.Errorf("remaining 1 without window: Rate ok %v Exhausted %v", ok, i.Exhausted())
	}
	if (Info{RetryAfter: time.Second, HasRetryAfter: true}).Announced() {
		t.Error("Retry-After alone is not quota information")
	}
	for f, s := range map[Form]string{None: "none", IETF: "ietf", IETFDraft: "ietf-draft", XRateLimit: "x-ratelimit", 99: "none"} {
		if f.String() != s {
			t.Errorf("Form(%d).String() = %q, want %q", f, f.String(), s)
		}
	}
}

// checkInvariants is what every Info must satisfy, whatever the input.
func checkInvariants(t *testing.T, i Info) {
	t.Helper()
	for name, d := range map[string]time.Duration{"RetryAfter": i.RetryAfter, "Reset": i.Reset, "Window": i.Window} {
		if d < 0 || d > MaxWait {
			t.Fatalf("%s = %v, outside [0, %v]: %+v", name, d, MaxWait, i)
		}
	}
	for name, f := range map[string]float64{"Limit": i.Limit, "Remaining": i.Remaining} {
		if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > MaxCount {
			t.Fatalf("%s = %v, outside [0, MaxCount]: %+v", name, f, i)
		}
	}
	if !i.HasRetryAfter && i.RetryAfter != 0 || !i.HasRemaining && i.Remaining != 0 || !i.HasReset && i.Reset != 0 {
		t.Fatalf("a value without its Has flag: %+v", i)
	}
	if (i.Form == None) == i.Announced() {
		t.Fatalf("Form %v with Announced %v: %+v", i.Form, i.Announced(), i)
	}
	if r, ok := i.Rate(); ok && (math.IsNaN(r) || math.IsInf(r, 0) || r <= 0) {
		t.Fatalf("Rate = %v: %+v", r, i)
	}
}

// An epoch reset is exact to the nanosecond against a clock between
// seconds (a float64 of epoch seconds is not: about 240 ns off).
func TestEpochResetExact(t *testing.T) {
	t.Parallel()
	at := now.Add(300 * time.Millisecond)
	for _, tt := range []struct {
		value string
		want  time.Duration
	}{
		{epochIn(time.Second), 700 * time.Millisecond},
		{epochIn(time.Minute) + ".5", 60200 * time.Millisecond},
		{strconv.FormatInt(now.Add(2*time.Second).UnixMilli(), 10), 1700 * time.Millisecond},
		{strconv.FormatInt(now.Add(2*time.Second).UnixMilli(), 10) + ".25", 1700250 * time.Microsecond},
	} {
		got := Parse(hdr("X-RateLimit-Reset", tt.value), at)
		if !got.HasReset || got.Reset != tt.want {
			t.Errorf("reset %s at +0.3 s: %v, want %v", tt.value, got.Reset, tt.want)
		}
	}
}
