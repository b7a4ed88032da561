package localpace

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/pacer"
)

// The AWS SDKs' adaptive retry mode, written from its description (botocore's
// retries/adaptive.py, throttling.py and bucket.py are the reference): per
// client, no shared state. Every answer is clocked into a measured send rate
// (0.5-s buckets, smoothed 0.8). Until the first throttle nothing is paced.
// On a throttle the rate to use is the measured rate (min(measured, fill
// rate) once pacing is on), CUBIC remembers it as w_max and the token
// bucket's fill rate becomes w_max × β; after any other answer the fill rate
// is C·(t − K)³ + w_max, t the time since the last throttle, K =
// ∛(w_max·(1 − β)/C); either way at most twice the measured rate. The
// bucket holds at most max(fill rate, 1) tokens and fills at least at
// awsMinRate.
const (
	awsBeta         = 0.7
	awsScale        = 0.4 // C
	awsSmoothing    = 0.8
	awsBucketRange  = 0.5 // seconds per measurement bucket
	awsMaxRateScale = 2.0
	awsMinRate      = 0.5
	awsStartRate    = 1.0 // the token bucket's first max rate
)

// cubic is botocore's CubicCalculator.
type cubic struct {
	wMax     float64
	k        float64
	lastFail time.Time
}

func newCubic(start time.Time) cubic {
	c := cubic{lastFail: start}
	c.k = c.zeroPoint()
	return c
}

func (c *cubic) zeroPoint() float64 { return math.Cbrt(c.wMax * (1 - awsBeta) / awsScale) }

// success is the rate after a non-throttled answer at now.
func (c *cubic) success(now time.Time) float64 {
	dt := now.Sub(c.lastFail).Seconds()
	return awsScale*math.Pow(dt-c.k, 3) + c.wMax
}

// throttled remembers rate as w_max and returns the rate after a throttle.
func (c *cubic) throttled(rate float64, now time.Time) float64 {
	c.wMax = rate
	c.k = c.zeroPoint()
	c.lastFail = now
	return rate * awsBeta
}

// rateClocker is botocore's RateClocker: the send rate, measured over
// 0.5-s buckets and smoothed.
type rateClocker struct {
	rate  float64
	last  float64 // the last bucket's start, seconds since the epoch
	count int
}

func newRateClocker(now time.Time) rateClocker {
	return rateClocker{last: math.Floor(secs(now))}
}

func secs(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// record counts one answer at now and returns the measured rate.
func (r *rateClocker) record(now time.Time) float64 {
	scale := 1 / awsBucketRange
	bucket := math.Floor(secs(now)*scale) / scale
	r.count++
	if bucket > r.last {
		rate := float64(r.count) / (bucket - r.last)
		r.rate = rate*awsSmoothing + r.rate*(1-awsSmoothing)
		r.count = 0
		r.last = bucket
	}
	return r.rate
}

// tokenBucket is botocore's TokenBucket (the blocking acquire is aws.acquire).
type tokenBucket struct {
	fill     float64 // tokens per second (botocore's max_rate reads it)
	capacity float64
	tokens   float64
	last     time.Time
}

func (b *tokenBucket) refill(now time.Time) {
	if b.last.IsZero() {
		b.last = now
		return
	}
	if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.tokens = min(b.capacity, b.tokens+dt*b.fill)
	}
	b.last = now
}

// setMaxRate refills at the old rate, then sets the new one.
func (b *tokenBucket) setMaxRate(now time.Time, rate float64) {
	b.refill(now)
	b.fill = max(rate, awsMinRate)
	b.capacity = max(rate, 1)
	b.tokens = min(b.tokens, b.capacity)
}

// aws is one platform's adaptive client-side rate limiter in one process,
// under a fixed cap (the process's share of the platform's ceiling: a
// client is configured with one), which it only ever lowers.
type aws struct {
	clock clock.Clock
	cap   float64

	mu      sync.Mutex
	gcra    gcra // the cap
	enabled bool // a throttle has been seen: the bucket paces
	cubic   cubic
	clocker rateClocker
	bucket  tokenBucket
	queue   []uint64 // tickets waiting for a token, first come first served
	ticket  uint64
	changed chan struct{} // closed when a token was taken or the rate changed
}

func newAWS(c clock.Clock, capRate float64) *aws {
	now := c.Now()
	a := &aws{clock: c, cap: capRate, cubic: newCubic(now), clocker: newRateClocker(now), changed: make(chan struct{})}
	a.bucket.setMaxRate(now, awsStartRate)
	return a
}

// reserve grants the next slot of the cap if neither it nor the token
// (estimated from the queue ahead) is more than maxWait away.
func (a *aws) reserve(now time.Time, maxWait time.Duration) (bool, time.Time, time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	slot := a.gcra.next(now)
	wait := slot.Sub(now)
	if a.enabled {
		a.bucket.refill(now)
		need := float64(len(a.queue)+1) - a.bucket.tokens
		wait = max(wait, time.Duration(need/a.bucket.fill*float64(time.Second)))
	}
	if wait > maxWait {
		return false, slot, wait
	}
	a.gcra.take(slot, a.cap)
	return true, slot, wait
}

// sleep takes a token (once pacing is on), then waits for the cap's slot.
func (a *aws) sleep(ctx context.Context, slot time.Time) error {
	if err := a.acquire(ctx); err != nil {
		return err
	}
	return clock.Sleep(ctx, a.clock, slot.Sub(a.clock.Now()))
}

// acquire blocks until the bucket has a token for this caller, first come
// first served; it returns at once while pacing is off.
func (a *aws) acquire(ctx context.Context) error {
	a.mu.Lock()
	if !a.enabled {
		a.mu.Unlock()
		return nil
	}
	t := a.ticket
	a.ticket++
	a.queue = append(a.queue, t)
	for {
		a.bucket.refill(a.clock.Now())
		pos := slices.Index(a.queue, t)
		if pos == 0 && a.bucket.tokens >= 1-1e-9 {
			a.bucket.tokens = max(a.bucket.tokens-1, 0)
			a.queue = a.queue[1:]
			a.notify()
			a.mu.Unlock()
			return nil
		}
		need := float64(pos+1) - a.bucket.tokens
		wait := max(time.Duration(math.Ceil(need/a.bucket.fill*1e6))*time.Microsecond, time.Microsecond)
		ch := a.changed
		a.mu.Unlock()
		timer := a.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			a.mu.Lock()
			if i := slices.Index(a.queue, t); i >= 0 {
				a.queue = slices.Delete(a.queue, i, i+1)
			}
			a.notify()
			a.mu.Unlock()
			return ctx.Err()
		case <-ch:
			timer.Stop()
		case <-timer.Chan():
		}
		a.mu.Lock()
	}
}

// notify wakes every waiter to look again. Called with mu held.
func (a *aws) notify() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// report is botocore's on_receiving_response: a 429 or 503 (pressure) is a
// throttle, any other answer a success.
func (a *aws) report(now time.Time, out pacer.Feedback) {
	a.mu.Lock()
	defer a.mu.Unlock()
	measured := a.clocker.record(now)
	var rate float64
	if out.Kind == pacer.Pressure {
		use := measured
		if a.enabled {
			use = min(measured, a.bucket.fill)
		}
		rate = a.cubic.throttled(use, now)
		a.enabled = true
	} else {
		rate = a.cubic.success(now)
	}
	a.bucket.setMaxRate(now, min(rate, awsMaxRateScale*measured))
	a.notify()
}

// state is what tests read: pacing on, the fill rate, the measured rate.
func (a *aws) state() (enabled bool, fill, measured float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.enabled, a.bucket.fill, a.clocker.rate
}
