package clock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/internal/clocktest"
)

func TestSleepEndsWithTheFakeClock(t *testing.T) {
	c := clocktest.New()
	done := make(chan error, 1)
	go func() { done <- clock.Sleep(context.Background(), c, time.Minute) }()
	clocktest.WaitSleepers(t, c, 1)
	select {
	case <-done:
		t.Fatal("Sleep returned before the clock moved")
	default:
	}
	c.Advance(time.Minute)
	if err := <-done; err != nil {
		t.Fatalf("Sleep: %v", err)
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	c := clocktest.New()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- clock.Sleep(ctx, c, time.Hour) }()
	clocktest.WaitSleepers(t, c, 1)
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("Sleep after cancel: got %v, want context.Canceled", err)
	}
	if err := clock.Sleep(ctx, c, 0); err != context.Canceled {
		t.Fatalf("Sleep on a cancelled context: got %v, want context.Canceled", err)
	}
}

func TestOrDefaultsToTheRealClock(t *testing.T) {
	if clock.Or(nil) != clock.Real() {
		t.Fatal("Or(nil) is not the real clock")
	}
	c := clocktest.New()
	if clock.Or(c) != c {
		t.Fatal("Or(c) is not c")
	}
}
