package bench

import (
	"context"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// latencies times samples calls of each op from one caller, ms each, after
// warmup rounds it does not time. The ops take turns, in an order that
// turns every round so none always follows another, and drift on a shared
// machine hits them alike.
func latencies(ctx context.Context, ops []func(context.Context) error, warmup, samples int) ([][]float64, error) {
	lat := make([][]float64, len(ops))
	for i := -warmup; i < samples; i++ {
		for j := range ops {
			k := (i + warmup + j) % len(ops)
			t0 := time.Now()
			if err := ops[k](ctx); err != nil {
				return nil, err
			}
			if i >= 0 {
				lat[k] = append(lat[k], ms(time.Since(t0)))
			}
		}
	}
	return lat, nil
}

// throughputs measures each op's throughput (throughput: callers callers
// for d), one op after another, in round's turn of the order latencies
// turns in.
func throughputs(ctx context.Context, ops []func(context.Context) error, round, callers int, d time.Duration) ([]float64, error) {
	out := make([]float64, len(ops))
	for j := range ops {
		k := (round + j) % len(ops)
		n, err := throughput(ctx, callers, d, ops[k])
		if err != nil {
			return nil, err
		}
		out[k] = n
	}
	return out, nil
}

// throughput runs fn from n callers for d and returns operations per second.
func throughput(ctx context.Context, n int, d time.Duration, fn func(context.Context) error) (float64, error) {
	var count atomic.Int64
	deadline := time.Now().Add(d)
	g, gctx := errgroup.WithContext(ctx)
	for range n {
		g.Go(func() error {
			for time.Now().Before(deadline) {
				if err := fn(gctx); err != nil {
					return err
				}
				count.Add(1)
			}
			return nil
		})
	}
	t0 := time.Now()
	if err := g.Wait(); err != nil {
		return 0, err
	}
	return float64(count.Load()) / time.Since(t0).Seconds(), nil
}
