package testdb

import (
	"fmt"
	"runtime"
	"testing"
)

// Open creates a fresh database with the fleetpace schema, as URL does, for
// code that has no testing.TB — an Example function — and returns its URL
// and a function that drops it.
func Open() (url string, drop func(), err error) {
	n := &noTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		url = URL(n)
	}()
	<-done
	drop = func() {
		for i := len(n.cleanups) - 1; i >= 0; i-- {
			n.cleanups[i]()
		}
	}
	if n.err != nil {
		drop()
		return "", nil, n.err
	}
	return url, drop, nil
}

// noTB is the part of testing.TB that URL uses; Fatalf ends the goroutine
// it runs on, as testing's does.
type noTB struct {
	testing.TB
	err      error
	cleanups []func()
}

func (n *noTB) Helper()          {}
func (n *noTB) Cleanup(f func()) { n.cleanups = append(n.cleanups, f) }
func (n *noTB) Fatalf(format string, args ...any) {
	n.err = fmt.Errorf(format, args...)
	runtime.Goexit()
}
