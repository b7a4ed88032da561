// Package localpace paces platforms inside one worker process, with no
// shared state, for the baselines of `fleetpace bench adapt`: "oracle"
// (every process paced at a fixed share of the destination's allowance ÷
// processes, no adaptation: the physical reference) and "aws" (the AWS SDKs' adaptive
// retry mode, per process: a token bucket whose rate follows CUBIC over the
// measured send rate). A Router puts them in front of the shared pacer for
// the platforms named by the worker's hidden --bench-local-pacer flag; every
// other platform goes to the shared pacer untouched.
package localpace

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/fleetpace/fleetpace/sources"
)

// Kinds of local pacer.
const (
	// KindOracle paces at fixed rates, changing at given instants.
	KindOracle = "oracle"
	// KindAWS is the AWS SDKs' adaptive retry mode under a fixed cap.
	KindAWS = "aws"
)

// ErrInvalidSpec is wrapped by every error of Parse.
var ErrInvalidSpec = errors.New("invalid local pacer")

// Step is a rate in force from an instant on.
type Step struct {
	// From is when the rate starts; zero for the first step.
	From time.Time
	// Rate is requests per second, > 0.
	Rate float64
}

// Spec is one platform's local pacer.
type Spec struct {
	Platform string
	// Kind is KindOracle or KindAWS.
	Kind string
	// Steps (oracle) are its rates in time order, the first from the
	// start. For aws, one step: the process's cap, requests/s (the
	// ceiling's share; the adaptive rate only lowers it).
	Steps []Step
	// Phase (oracle), in [0, 1), puts the process's slots on a grid of
	// its spacing, shifted by Phase spacings, counted from each step's
	// start (the Unix epoch for the first): N processes at rate/N with
	// phases 0, 1/N, …, (N−1)/N interleave into one fleet spaced exactly
	// 1/rate. Default 0.
	Phase float64
}

// Parse reads PLATFORM=oracle:RATE[@UNIXMS:RATE]…[~PHASE] (a fixed rate,
// changing to the next RATE at the wall-clock instant UNIXMS, in
// milliseconds since the epoch, on a grid shifted by PHASE spacings) or
// PLATFORM=aws:CAP (CAP: requests/s this process never exceeds).
func Parse(s string) (Spec, error) {
	platform, rest, ok := strings.Cut(s, "=")
	if !ok || platform == "" {
		return Spec{}, fmt.Errorf("%w %q: want PLATFORM=oracle:RATE[@UNIXMS:RATE]… or PLATFORM=aws:CAP", ErrInvalidSpec, s)
	}
	if err := (sources.Platform{Name: platform, RatePerSec: 1}).WithDefaults().Validate(); err != nil {
		return Spec{}, fmt.Errorf("%w %q: platform: %w", ErrInvalidSpec, s, err)
	}
	kind, args, _ := strings.Cut(rest, ":")
	sp := Spec{Platform: platform, Kind: kind}
	switch kind {
	case KindAWS:
		r, err := parseRate(args)
		if err != nil {
			return Spec{}, fmt.Errorf("%w %q: cap: %w", ErrInvalidSpec, s, err)
		}
		sp.Steps = []Step{{Rate: r}}
	case KindOracle:
		args, phase, hasPhase := strings.Cut(args, "~")
		if hasPhase {
			p, err := strconv.ParseFloat(phase, 64)
			if err != nil || !(p >= 0 && p < 1) {
				return Spec{}, fmt.Errorf("%w %q: the phase must be in [0, 1), got %q", ErrInvalidSpec, s, phase)
			}
			sp.Phase = p
		}
		parts := strings.Split(args, "@")
		r, err := parseRate(parts[0])
		if err != nil {
			return Spec{}, fmt.Errorf("%w %q: rate: %w", ErrInvalidSpec, s, err)
		}
		sp.Steps = []Step{{Rate: r}}
		for _, p := range parts[1:] {
			at, rate, ok := strings.Cut(p, ":")
			ms, err := strconv.ParseInt(at, 10, 64)
			if !ok || err != nil || ms <= 0 {
				return Spec{}, fmt.Errorf("%w %q: a change must be @UNIXMS:RATE, got @%s", ErrInvalidSpec, s, p)
			}
			r, err := parseRate(rate)
			if err != nil {
				return Spec{}, fmt.Errorf("%w %q: rate: %w", ErrInvalidSpec, s, err)
			}
			from := time.UnixMilli(ms)
			if prev := sp.Steps[len(sp.Steps)-1].From; !from.After(prev) {
				return Spec{}, fmt.Errorf("%w %q: changes must be in time order", ErrInvalidSpec, s)
			}
			sp.Steps = append(sp.Steps, Step{From: from, Rate: r})
		}
	default:
		return Spec{}, fmt.Errorf("%w %q: kind must be %s or %s, got %q", ErrInvalidSpec, s, KindOracle, KindAWS, kind)
	}
	return sp, nil
}

// String is the spec as Parse reads it.
func (sp Spec) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s=%s:%s", sp.Platform, sp.Kind, fmtRate(sp.Steps[0].Rate))
	for _, st := range sp.Steps[1:] {
		fmt.Fprintf(&b, "@%d:%s", st.From.UnixMilli(), fmtRate(st.Rate))
	}
	if sp.Phase != 0 {
		fmt.Fprintf(&b, "~%s", strconv.FormatFloat(sp.Phase, 'g', -1, 64))
	}
	return b.String()
}

func parseRate(s string) (float64, error) {
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || !(r >= sources.MinRate && r <= sources.MaxRate) || math.IsInf(r, 0) {
		return 0, fmt.Errorf("want a rate in [%g, %g] requests/s, got %q", sources.MinRate, sources.MaxRate, s)
	}
	return r, nil
}

func fmtRate(r float64) string { return strconv.FormatFloat(r, 'g', -1, 64) }
