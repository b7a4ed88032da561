// Package ratelimit reads what an HTTP response says about the destination's
// rate limit: Retry-After, and the quota fields of the three header families
// in use — the IETF RateLimit and RateLimit-Policy structured fields
// (draft-ietf-httpapi-ratelimit-headers), the draft's older
// RateLimit-Limit/-Remaining/-Reset fields, and the common X-RateLimit-*
// family (GitHub, Twitter/X, Discord, most API gateways).
//
// Every value comes from a destination fleetpace does not control, so the
// parser assumes nothing: it never panics, never returns a negative, NaN or
// infinite number, and caps every duration at MaxWait, whatever it is sent
// (negative, overflowing, fractional, far-future dates, megabyte values,
// thousands of repeated lines). A malformed field is treated as absent.
package ratelimit

import (
	"math"
	"net/http"
	"strings"
	"time"
)

// MaxWait caps every wait derived from a destination's headers (Retry-After,
// a reset time): 24 h. A destination that asks for longer gets 24 h, and is
// asked again then; this keeps one hostile or broken header from holding a
// platform for centuries or overflowing a time.Duration downstream.
const MaxWait = 24 * time.Hour

// MaxCount caps Info.Limit and Info.Remaining: a larger announced number
// means "no practical limit" and stays finite and exactly representable.
const MaxCount = 1e15

// Form is the header family quota information came from.
type Form uint8

const (
	// None: the response announced no quota.
	None Form = iota
	// IETF: the structured fields of the current draft,
	// `RateLimit-Policy: "default";q=100;w=60` and
	// `RateLimit: "default";r=50;t=30`.
	IETF
	// IETFDraft: the draft's older forms — `RateLimit-Limit: 100, 100;w=60`,
	// `RateLimit-Remaining: 50`, `RateLimit-Reset: 30`, a policy as
	// `RateLimit-Policy: 100;w=60`, and draft-07's dictionary
	// `RateLimit: limit=100, remaining=50, reset=30`.
	IETFDraft
	// XRateLimit: X-RateLimit-Limit / -Remaining / -Reset (also spelled
	// X-Rate-Limit-*, and X-RateLimit-Reset-After for a delta).
	XRateLimit
)

// String names the form: "none", "ietf", "ietf-draft" or "x-ratelimit".
func (f Form) String() string {
	switch f {
	case IETF:
		return "ietf"
	case IETFDraft:
		return "ietf-draft"
	case XRateLimit:
		return "x-ratelimit"
	}
	return "none"
}

// Info is what one response said about the destination's rate limit. Every
// duration is in [0, MaxWait]; Limit and Remaining are finite, in
// [0, MaxCount]; a Has flag that is false leaves its value 0.
type Info struct {
	// RetryAfter is Retry-After (delta seconds or an HTTP-date), capped at
	// MaxWait. HasRetryAfter is false when the field is absent or malformed.
	RetryAfter    time.Duration
	HasRetryAfter bool

	// Limit is the quota per Window (0: not announced). For X-RateLimit and
	// the older draft's RateLimit-Limit it is the limit of the current
	// window, whatever its length.
	Limit float64

	// Remaining is how many requests are left in the current window; valid
	// only if HasRemaining. It may be fractional if the destination says so;
	// below 1 the quota is exhausted (see Exhausted).
	Remaining    float64
	HasRemaining bool

	// Reset is the time until the quota resets or refills, capped at MaxWait,
	// never negative; valid only if HasReset. A reset value above 1e9 that
	// lies within MaxWait of now as Unix epoch seconds (or above 1e12, as
	// epoch milliseconds) is read as a point in time (GitHub's
	// X-RateLimit-Reset); any other value as delta seconds, fractions
	// allowed ("0.125").
	Reset    time.Duration
	HasReset bool

	// Window is the policy's window (RateLimit-Policy w=, or "100;w=60" in
	// RateLimit-Limit), 0 when not announced. Limit/Window is the announced
	// long-run rate. A window longer than MaxWait is reported as MaxWait with
	// Limit scaled down in proportion, so Limit/Window stays the announced
	// rate (a monthly quota becomes its daily share).
	Window time.Duration

	// Form is the header family the quota fields (Limit, Remaining, Reset,
	// Window) came from; None when there were none. Retry-After is read
	// whatever the form.
	Form Form
}

// Announced reports whether the response carried any quota information
// (Retry-After alone is not quota information).
func (i Info) Announced() bool {
	return i.Limit > 0 || i.HasRemaining || i.HasReset || i.Window > 0
}

// Exhausted reports whether the destination said no request is left in the
// current window (Remaining below 1): the next one waits for Reset.
func (i Info) Exhausted() bool { return i.HasRemaining && i.Remaining < 1 }

// Rate is the announced long-run rate in requests per second, Limit/Window;
// ok is false unless both were announced.
func (i Info) Rate() (perSecond float64, ok bool) {
	if i.Limit <= 0 || i.Window <= 0 {
		return 0, false
	}
	return i.Limit / i.Window.Seconds(), true
}

// Parse reads the rate-limit fields of a response's header, now being when
// the response arrived (for HTTP-dates and epoch reset times).
//
// Retry-After is read from its first line. Quota fields are read from the
// first family that announces anything, in this order: IETF (RateLimit with
// r=, or a RateLimit-Policy with q=), IETFDraft, XRateLimit. Families are
// not mixed. When RateLimit lists several policies, the most restrictive is
// taken: the one with the least remaining (on a tie, the later reset), with
// the quota and window of the RateLimit-Policy entry of the same name (or of
// the only entry, when each field lists one). When only RateLimit-Policy is
// sent, the policy with the lowest rate q/w is taken.
func Parse(h http.Header, now time.Time) Info {
	var info Info
	if v, ok := first(h, "Retry-After"); ok {
		info.RetryAfter, info.HasRetryAfter = ParseRetryAfter(v, now)
	}
	for _, parse := range []func(http.Header, time.Time, *Info) bool{parseIETF, parseDraft, parseX} {
		var q Info
		if parse(h, now, &q) && q.Announced() {
			q.RetryAfter, q.HasRetryAfter = info.RetryAfter, info.HasRetryAfter
			info = q
			break
		}
	}
	return info.clamped()
}

// ParseRetryAfter parses a Retry-After value in either form: delta seconds
// ("120") or an HTTP-date ("Wed, 21 Oct 2015 07:28:00 GMT", and the obsolete
// RFC 850 and asctime forms), the latter relative to now. The result is
// capped at MaxWait: a number of seconds too large for any integer type is
// valid and means MaxWait, as does a date in year 9999.
//
// ok is false for an empty or malformed value, including negative or
// fractional seconds (RFC 9110 allows only digits); the duration is then 0.
// A date in the past is valid and yields 0.
func ParseRetryAfter(value string, now time.Time) (d time.Duration, ok bool) {
	value = strings.Trim(value, " \t")
	if value == "" {
		return 0, false
	}
	if isDigits(value) {
		// Leading zeros aside, more than 5 digits is already over a day.
		digits := strings.TrimLeft(value, "0")
		if len(digits) > 5 {
			return MaxWait, true
		}
		var secs int64
		for i := 0; i < len(digits); i++ {
			secs = secs*10 + int64(digits[i]-'0')
		}
		return min(time.Duration(secs)*time.Second, MaxWait), true
	}
	if len(value) > 64 { // an HTTP-date is 24 to 33 bytes; do not parse megabytes
		return 0, false
	}
	t, err := http.ParseTime(value)
	if err != nil {
		return 0, false
	}
	return clampDuration(t.Sub(now)), true // Time.Sub saturates
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return s != ""
}

// first returns the first line of a field.
func first(h http.Header, key string) (string, bool) {
	vs := h.Values(key)
	if len(vs) == 0 {
		return "", false
	}
	return vs[0], true
}

// policy is one quota policy: q requests per w seconds (w 0: unknown).
type policy struct {
	name string
	q, w float64
	ietf bool // stated with q= (current draft) rather than as "100;w=60"
}

// policies reads the entries of a RateLimit-Policy field, either form.
func policies(members []member) []policy {
	var out []policy
	for _, m := range members {
		if m.key != "" {
			continue
		}
		p := policy{name: m.name()}
		if q, ok := m.number("q"); ok {
			p.q, p.ietf = q, true
		} else if m.value.kind == kindNumber && m.value.num >= 0 {
			p.q = m.value.num
		} else {
			continue
		}
		p.w, _ = m.number("w")
		out = append(out, p)
	}
	return out
}

// setPolicy sets Limit and Window from q requests per w seconds, keeping
// q/w when w exceeds MaxWait.
func (i *Info) setPolicy(q, w float64) {
	q = min(q, MaxCount)
	if w > MaxWait.Seconds() {
		q = q * MaxWait.Seconds() / w
		w = MaxWait.Seconds()
	}
	i.Limit = q
	i.Window, _ = seconds(w)
}

func (i *Info) setReset(v float64, now time.Time) {
	i.Reset, i.HasReset = resetDuration(v, now), true
}

func (i *Info) setRemaining(v float64) {
	i.Remaining, i.HasRemaining = min(v, MaxCount), true
}

// parseIETF reads the current draft's RateLimit and RateLimit-Policy
// structured fields (and draft-07's dictionary form of RateLimit, reported
// as IETFDraft).
func parseIETF(h http.Header, now time.Time, info *Info) bool {
	rl, _ := parseField(h.Values("RateLimit"))
	pmembers, _ := parseField(h.Values("RateLimit-Policy"))
	pols := policies(pmembers)

	if parseDict(rl, pols, now, info) {
		return true
	}

	best, n := -1, 0
	var bestR, bestT float64
	var bestHasT bool
	for i, m := range rl {
		r, ok := m.number("r")
		if !ok || m.key != "" {
			continue
		}
		n++
		t, hasT := m.number("t")
		if best < 0 || r < bestR || r == bestR && hasT && (!bestHasT || t > bestT) {
			best, bestR, bestT, bestHasT = i, r, t, hasT
		}
	}
	if best >= 0 {
		info.Form = IETF
		info.setRemaining(bestR)
		if bestHasT {
			info.setReset(bestT, now)
		}
		name := rl[best].name()
		for _, p := range pols {
			if p.name == name && p.name != "" {
				info.setPolicy(p.q, p.w)
				return true
			}
		}
		if n == 1 && len(pols) == 1 {
			info.setPolicy(pols[0].q, pols[0].w)
		}
		return true
	}

	// Policies alone: the lowest rate.
	var chosen *policy
	for i := range pols {
		p := &pols[i]
		if !p.ietf {
			continue
		}
		if chosen == nil || lowerRate(*p, *chosen) {
			chosen = p
		}
	}
	if chosen == nil {
		return false
	}
	info.Form = IETF
	info.setPolicy(chosen.q, chosen.w)
	return true
}

// lowerRate orders policies by q/w; a policy without a window ranks after
// every one with a window, and among themselves by q.
func lowerRate(a, b policy) bool {
	switch {
	case a.w > 0 && b.w > 0:
		return a.q/a.w < b.q/b.w
	case a.w > 0 || b.w > 0:
		return a.w > 0
	}
	return a.q < b.q
}

// parseDict reads draft-07's `RateLimit: limit=10, remaining=5, reset=3`.
func parseDict(rl []member, pols []policy, now time.Time, info *Info) bool {
	found := false
	for _, m := range rl {
		if m.key == "" || m.value.kind != kindNumber || m.value.num < 0 {
			continue
		}
		v := m.value.num
		switch m.key {
		case "limit":
			info.Limit, found = min(v, MaxCount), true
		case "remaining":
			info.setRemaining(v)
			found = true
		case "reset":
			info.setReset(v, now)
			found = true
		}
	}
	if !found {
		return false
	}
	info.Form = IETFDraft
	if info.Limit > 0 {
		if w, ok := windowFor(info.Limit, nil, pols); ok {
			info.setPolicy(info.Limit, w)
		}
	}
	return true
}

// parseDraft reads RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset.
func parseDraft(h http.Header, now time.Time, info *Info) bool {
	pmembers, _ := parseField(h.Values("RateLimit-Policy"))
	return parseTriple(h, now, info, IETFDraft, policies(pmembers), "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "")
}

// parseX reads the X-RateLimit-* family, then its X-Rate-Limit-* spelling.
func parseX(h http.Header, now time.Time, info *Info) bool {
	return parseTriple(h, now, info, XRateLimit, nil, "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Reset-After") ||
		parseTriple(h, now, info, XRateLimit, nil, "X-Rate-Limit-Limit", "X-Rate-Limit-Remaining", "X-Rate-Limit-Reset", "")
}

// parseTriple reads a limit field (a number, optionally with policies:
// "100, 100;w=60"), a remaining field and a reset field (delta or epoch
// seconds, or an HTTP-date), with resetAfter as a delta-only alternative;
// pols are RateLimit-Policy entries that may give the limit's window.
func parseTriple(h http.Header, now time.Time, info *Info, form Form, pols []policy, limitKey, remainingKey, resetKey, resetAfterKey string) bool {
	found := false
	if members, ok := parseField(h.Values(limitKey)); ok {
		if m := members[0]; m.key == "" && m.value.kind == kindNumber && m.value.num >= 0 {
			info.Limit, found = min(m.value.num, MaxCount), true
			if w, ok := windowFor(m.value.num, members, pols); ok {
				info.setPolicy(m.value.num, w)
			}
		}
	}
	if v, ok := first(h, remainingKey); ok {
		if r, ok := plainNumber(v); ok {
			info.setRemaining(r)
			found = true
		}
	}
	if v, ok := first(h, resetKey); ok {
		if r, ok := plainNumber(v); ok {
			info.setReset(r, now)
			found = true
		} else if len(v) <= 64 {
			if t, err := http.ParseTime(strings.Trim(v, " \t")); err == nil {
				info.Reset, info.HasReset, found = clampDuration(t.Sub(now)), true, true
			}
		}
	}
	if v, ok := first(h, resetAfterKey); ok && resetAfterKey != "" && !info.HasReset {
		if r, ok := plainNumber(v); ok {
			info.Reset, info.HasReset = clampSeconds(r), true
			found = true
		}
	}
	if found {
		info.Form = form
	}
	return found
}

// windowFor finds the window of the policy whose quota is limit: the w of
// the limit field's own first member, else of a later member or a
// RateLimit-Policy entry with the same quota.
func windowFor(limit float64, limitMembers []member, pols []policy) (float64, bool) {
	for i, m := range limitMembers {
		if i > 0 && (m.value.kind != kindNumber || m.value.num != limit) {
			continue
		}
		if w, ok := m.number("w"); ok && w > 0 {
			return w, true
		}
	}
	for _, p := range pols {
		if p.q == limit && p.w > 0 {
			return p.w, true
		}
	}
	return 0, false
}

// epochMin: a reset value above this (2001-09-09 as Unix seconds) may be a
// point in time rather than a delta.
const epochMin = 1e9

// resetDuration reads a reset value: Unix epoch seconds (or milliseconds)
// when it is large and lands within MaxWait of now, delta seconds otherwise.
func resetDuration(v float64, now time.Time) time.Duration {
	if v > epochMin && v < 1e18 {
		// Whole units and the fraction apart, so the difference from now
		// is exact to the nanosecond (a float64 of epoch seconds is not).
		whole, frac := math.Modf(v)
		for _, at := range []time.Time{
			time.Unix(int64(whole), int64(math.Round(frac*1e9))),
			time.UnixMilli(int64(whole)).Add(time.Duration(math.Round(frac * 1e6))),
		} {
			if d := at.Sub(now); d >= -MaxWait && d <= MaxWait {
				return clampDuration(d)
			}
		}
	}
	return clampSeconds(v)
}

// seconds converts a number of seconds to a Duration in [0, MaxWait]; ok is
// false for a non-positive or NaN input.
func seconds(s float64) (time.Duration, bool) {
	if !(s > 0) {
		return 0, false
	}
	return clampSeconds(s), true
}

// clampSeconds converts seconds to a Duration in [0, MaxWait], rounding to
// the nanosecond; negative and NaN become 0.
func clampSeconds(s float64) time.Duration {
	switch {
	case !(s > 0):
		return 0
	case s >= MaxWait.Seconds():
		return MaxWait
	}
	return time.Duration(math.Round(s * float64(time.Second)))
}

func clampDuration(d time.Duration) time.Duration { return min(max(d, 0), MaxWait) }

func clampCount(f float64) float64 {
	if !(f > 0) { // also NaN
		return 0
	}
	return min(f, MaxCount)
}

// clamped enforces Info's invariants, whatever the parsers did.
func (i Info) clamped() Info {
	i.RetryAfter = clampDuration(i.RetryAfter)
	i.Reset = clampDuration(i.Reset)
	i.Window = clampDuration(i.Window)
	i.Limit = clampCount(i.Limit)
	i.Remaining = clampCount(i.Remaining)
	if !i.HasRetryAfter {
		i.RetryAfter = 0
	}
	if !i.HasRemaining {
		i.Remaining = 0
	}
	if !i.HasReset {
		i.Reset = 0
	}
	if !i.Announced() {
		i.Form = None
	}
	return i
}
