package sources

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// NamePattern is what a platform name must match: lower-case letters, digits,
// '.', '_' and '-', starting with a letter or digit, at most 63 characters.
const NamePattern = `^[a-z0-9][a-z0-9_.-]{0,62}$`

var nameRE = regexp.MustCompile(NamePattern)

// nameRule is the reason a bad platform name is refused, in words first:
// "Feeds" or "my feeds" is the usual mistake.
const nameRule = "must be lower-case: letters a-z, digits, '.', '_' and '-', starting with a letter or digit, " +
	"at most 63 characters (" + NamePattern + ")"

// Platform defaults, as in the schema. The adaptation defaults were chosen
// by measurement (`fleetpace bench adapt --sweep`, see the README).
const (
	DefaultBurst          = 1
	DefaultMaxMultiplier  = 16
	DefaultDecayAfter     = 100
	DefaultCooldown       = 15 * time.Minute
	DefaultBackoffFactor  = 1.5
	DefaultRecoveryFactor = 1.1
)

// Adaptations a platform may use (Platform.Adapt).
const (
	// AdaptEstimate measures what the destination accepts when it pushes
	// back and paces the fleet just under that, recovering in time (the
	// default).
	AdaptEstimate = "estimate"
	// AdaptMultiplier is the shared backoff multiplier: pressure multiplies
	// it by BackoffFactor, every DecayAfter clean responses divide it by
	// RecoveryFactor (with Probe, in small steps near where the pressure
	// began).
	AdaptMultiplier = "multiplier"
)

// Bounds of the adaptation settings, as in the schema's checks.
const (
	MinFactor     = 1.01
	MaxFactor     = 16
	MaxDecayAfter = 1_000_000
)

// Platform is one destination and its limits. A zero Burst, MaxMultiplier,
// DecayAfter or Cooldown means the default.
type Platform struct {
	Name          string        `json:"name"`
	RatePerSec    float64       `json:"rate_per_sec"`   // fleet-wide ceiling, requests per second
	Burst         int           `json:"burst"`          // requests allowed back to back; default 1
	MaxMultiplier float64       `json:"max_multiplier"` // largest backoff multiplier; default 16
	DecayAfter    int           `json:"decay_after"`    // clean responses, fleet-wide, per recovery step; default 100
	Cooldown      time.Duration `json:"-"`              // pause after the platform says stop; default 15m (JSON: cooldown_s)
	// Adapt is how the fleet adapts when the destination pushes back:
	// AdaptEstimate (default, "") or AdaptMultiplier. BackoffFactor,
	// RecoveryFactor, DecayAfter and NoProbe shape the multiplier only.
	Adapt string `json:"adapt"`
	// BackoffFactor multiplies the shared multiplier on rate pressure (once
	// per episode); default DefaultBackoffFactor, in [MinFactor, MaxFactor].
	BackoffFactor float64 `json:"backoff_factor"`
	// RecoveryFactor divides it every DecayAfter clean responses; default
	// DefaultRecoveryFactor, in [MinFactor, MaxFactor].
	RecoveryFactor float64 `json:"recovery_factor"`
	// The three switches below are named for their setting, as the flags
	// of `platforms set` (--probe, --use-headers, --respace) and the
	// columns (probe, use_headers, respace) are; each is on by default, so
	// the Go field is its negation and the zero value keeps it on.
	//
	// NoProbe turns probing recovery off: recovery then divides by
	// RecoveryFactor all the way (with factors 2, 2 and DecayAfter 100 the
	// classic multiplicative schedule). Default: probing, which stops just
	// short of where the last pressure began and climbs from there in
	// small steps.
	NoProbe bool `json:"no_probe,omitempty"`
	// NoUseHeaders turns pacing by the destination's announced rate-limit
	// headers (RateLimit, X-RateLimit-*) off; Retry-After is honoured
	// regardless.
	NoUseHeaders bool `json:"no_use_headers,omitempty"`
	// NoRespace lets slots already granted be used at their old spacing
	// after a slow-down (a benchmark's baseline). Default: re-spaced
	// fleet-wide at once.
	NoRespace bool `json:"no_respace,omitempty"`

	// Nested limits (docs/keys.md). KeyRate is the most requests per
	// second of each key on the platform (a source's key: an account, a
	// token's name), beside the platform's RatePerSec for all keys
	// together; 0: no per-key rate. KeyBurst is each key's burst (default
	// 1). A key's own limits (SetKeyLimit) override both.
	KeyRate  float64 `json:"key_rate_per_sec"`
	KeyBurst int     `json:"key_burst"`
	// MaxInFlight caps the requests open at once to the platform, fleet-wide;
	// KeyMaxInFlight those of each key. 0: no cap.
	MaxInFlight    int `json:"max_in_flight"`
	KeyMaxInFlight int `json:"key_max_in_flight"`
}

// WithDefaults fills the zero fields with their defaults.
func (p Platform) WithDefaults() Platform {
	p.Burst = cmp.Or(p.Burst, DefaultBurst)
	p.MaxMultiplier = cmp.Or(p.MaxMultiplier, DefaultMaxMultiplier)
	p.DecayAfter = cmp.Or(p.DecayAfter, DefaultDecayAfter)
	p.Cooldown = cmp.Or(p.Cooldown, DefaultCooldown)
	p.BackoffFactor = cmp.Or(p.BackoffFactor, DefaultBackoffFactor)
	p.RecoveryFactor = cmp.Or(p.RecoveryFactor, DefaultRecoveryFactor)
	p.Adapt = cmp.Or(p.Adapt, AdaptEstimate)
	p.KeyBurst = cmp.Or(p.KeyBurst, DefaultBurst)
	return p
}

// Validate checks every field as given and names the first bad one: a zero
// Burst, say, is invalid here (SetPlatform applies the defaults first, then
// validates). A command line whose flags all have values validates with it
// before it writes anything.
func (p Platform) Validate() error {
	switch {
	case !nameRE.MatchString(p.Name):
		return &FieldError{Field: "name", Value: p.Name, Reason: nameRule}
	case !(p.RatePerSec >= MinRate && p.RatePerSec <= MaxRate): // NaN too
		return &FieldError{Field: "rate_per_sec", Value: fmtFloat(p.RatePerSec), Reason: fmt.Sprintf("must be in [%g, %g] requests per second", MinRate, MaxRate)}
	case p.Burst < 1 || p.Burst > MaxBurst:
		return &FieldError{Field: "burst", Value: strconv.Itoa(p.Burst), Reason: fmt.Sprintf("must be in [1, %d]", MaxBurst)}
	case p.Cooldown < MinCooldown || p.Cooldown > MaxCooldown:
		return &FieldError{Field: "cooldown", Value: p.Cooldown.String(), Reason: fmt.Sprintf("must be in [%s, %s]", MinCooldown, fmtHours(MaxCooldown))}
	case !(p.MaxMultiplier >= 1 && p.MaxMultiplier <= MaxMultiplierLimit):
		return &FieldError{Field: "max_multiplier", Value: fmtFloat(p.MaxMultiplier), Reason: fmt.Sprintf("must be in [1, %d]", MaxMultiplierLimit)}
	case p.DecayAfter < 1 || p.DecayAfter > MaxDecayAfter:
		return &FieldError{Field: "decay_after", Value: strconv.Itoa(p.DecayAfter), Reason: fmt.Sprintf("must be in [1, %d]", MaxDecayAfter)}
	case !(p.BackoffFactor >= MinFactor && p.BackoffFactor <= MaxFactor):
		return &FieldError{Field: "backoff_factor", Value: fmtFloat(p.BackoffFactor), Reason: fmt.Sprintf("must be in [%g, %g]", MinFactor, float64(MaxFactor))}
	case !(p.RecoveryFactor >= MinFactor && p.RecoveryFactor <= MaxFactor):
		return &FieldError{Field: "recovery_factor", Value: fmtFloat(p.RecoveryFactor), Reason: fmt.Sprintf("must be in [%g, %g]", MinFactor, float64(MaxFactor))}
	case p.Adapt != AdaptEstimate && p.Adapt != AdaptMultiplier:
		return &FieldError{Field: "adapt", Value: p.Adapt, Reason: "must be " + AdaptEstimate + " or " + AdaptMultiplier}
	case p.KeyRate != 0 && !(p.KeyRate >= MinRate && p.KeyRate <= MaxRate):
		return &FieldError{Field: "key_rate", Value: fmtFloat(p.KeyRate), Reason: fmt.Sprintf("must be 0 (no per-key rate) or in [%g, %g] requests per second", MinRate, MaxRate)}
	case p.KeyBurst < 1 || p.KeyBurst > MaxBurst:
		return &FieldError{Field: "key_burst", Value: strconv.Itoa(p.KeyBurst), Reason: fmt.Sprintf("must be in [1, %d]", MaxBurst)}
	case p.MaxInFlight < 0 || p.MaxInFlight > MaxInFlight:
		return &FieldError{Field: "max_in_flight", Value: strconv.Itoa(p.MaxInFlight), Reason: fmt.Sprintf("must be in [0, %d] (0: no cap)", MaxInFlight)}
	case p.KeyMaxInFlight < 0 || p.KeyMaxInFlight > MaxInFlight:
		return &FieldError{Field: "key_max_in_flight", Value: strconv.Itoa(p.KeyMaxInFlight), Reason: fmt.Sprintf("must be in [0, %d] (0: no cap)", MaxInFlight)}
	}
	return nil
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// fmtHours prints a whole number of hours as "24h" rather than "24h0m0s".
func fmtHours(d time.Duration) string { return strconv.Itoa(int(d/time.Hour)) + "h" }

// SetPlatform creates or replaces a platform's configuration. Invalid input
// writes nothing and returns an error wrapping ErrInvalid.
func SetPlatform(ctx context.Context, db DBTX, p Platform) (Platform, error) {
	p = p.WithDefaults()
	if err := p.Validate(); err != nil {
		return p, fmt.Errorf("platform: %w", err)
	}
	_, err := db.Exec(ctx, setPlatformSQL, p.Name, p.RatePerSec, p.Burst, p.MaxMultiplier, p.DecayAfter, p.Cooldown,
		p.BackoffFactor, p.RecoveryFactor, !p.NoProbe, !p.NoUseHeaders, !p.NoRespace, p.Adapt,
		p.KeyRate, p.KeyBurst, p.MaxInFlight, p.KeyMaxInFlight)
	if err != nil {
		return p, fmt.Errorf("platform: set %s: %w", p.Name, err)
	}
	return p, nil
}

// ListPlatforms returns every platform, by name.
func ListPlatforms(ctx context.Context, db DBTX) ([]Platform, error) {
	out, err := queryRows(ctx, db, scanPlatform, listPlatformsSQL)
	if err != nil {
		return nil, fmt.Errorf("platform: list: %w", err)
	}
	return out, nil
}

// GetPlatform returns one platform or an error wrapping ErrNotFound.
func GetPlatform(ctx context.Context, db DBTX, name string) (Platform, error) {
	p, err := queryRow(ctx, db, scanPlatform, getPlatformSQL, name)
	if errors.Is(err, pgx.ErrNoRows) {
		return Platform{}, fmt.Errorf("platform %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return Platform{}, fmt.Errorf("platform: get: %w", err)
	}
	return p, nil
}

func scanPlatform(row pgx.CollectableRow) (Platform, error) {
	var p Platform
	var probe, headers, respace bool
	err := row.Scan(&p.Name, &p.RatePerSec, &p.Burst, &p.MaxMultiplier, &p.DecayAfter, &p.Cooldown,
		&p.BackoffFactor, &p.RecoveryFactor, &probe, &headers, &respace, &p.Adapt,
		&p.KeyRate, &p.KeyBurst, &p.MaxInFlight, &p.KeyMaxInFlight)
	p.NoProbe, p.NoUseHeaders, p.NoRespace = !probe, !headers, !respace
	return p, err
}

// PlatformUpdate is a change to a platform's settings: nil fields stay as
// they are (for a new platform: their defaults; RatePerSec is then
// required).
type PlatformUpdate struct {
	RatePerSec     *float64
	Burst          *int
	MaxMultiplier  *float64
	DecayAfter     *int
	Cooldown       *time.Duration
	BackoffFactor  *float64
	RecoveryFactor *float64
	Probe          *bool // --probe; false sets Platform.NoProbe
	UseHeaders     *bool // --use-headers; false sets Platform.NoUseHeaders
	Respace        *bool // --respace; false sets Platform.NoRespace
	Adapt          *string
	KeyRate        *float64
	KeyBurst       *int
	MaxInFlight    *int
	KeyMaxInFlight *int
}

// Apply returns p with the update's fields set.
func (u PlatformUpdate) Apply(p Platform) Platform {
	set := func(dst *float64, v *float64) {
		if v != nil {
			*dst = *v
		}
	}
	set(&p.RatePerSec, u.RatePerSec)
	set(&p.MaxMultiplier, u.MaxMultiplier)
	set(&p.BackoffFactor, u.BackoffFactor)
	set(&p.RecoveryFactor, u.RecoveryFactor)
	set(&p.KeyRate, u.KeyRate)
	for _, f := range []struct{ dst, v *int }{{&p.KeyBurst, u.KeyBurst}, {&p.MaxInFlight, u.MaxInFlight}, {&p.KeyMaxInFlight, u.KeyMaxInFlight}} {
		if f.v != nil {
			*f.dst = *f.v
		}
	}
	if u.Burst != nil {
		p.Burst = *u.Burst
	}
	if u.DecayAfter != nil {
		p.DecayAfter = *u.DecayAfter
	}
	if u.Cooldown != nil {
		p.Cooldown = *u.Cooldown
	}
	if u.Probe != nil {
		p.NoProbe = !*u.Probe
	}
	if u.UseHeaders != nil {
		p.NoUseHeaders = !*u.UseHeaders
	}
	if u.Respace != nil {
		p.NoRespace = !*u.Respace
	}
	if u.Adapt != nil {
		p.Adapt = *u.Adapt
	}
	return p
}

// ConfigurePlatform changes the given settings of a platform and keeps the
// others (a partial update), or creates the platform when it does not
// exist: then RatePerSec is required and the other settings default. The
// change is validated whole before anything is written (invalid input
// writes nothing and wraps ErrInvalid). It returns the platform as saved
// and whether it was created.
func ConfigurePlatform(ctx context.Context, db Beginner, name string, u PlatformUpdate) (p Platform, created bool, err error) {
	if !nameRE.MatchString(name) {
		return Platform{}, false, fmt.Errorf("platform: %w", &FieldError{Field: "name", Value: name, Reason: nameRule})
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return Platform{}, false, fmt.Errorf("platform: set %s: %w", name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	cur, err := queryRow(ctx, tx, scanPlatform, lockPlatformSQL, name)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if u.RatePerSec == nil {
			return Platform{}, false, fmt.Errorf("platform: %w", &FieldError{Field: "rate_per_sec", Value: "",
				Reason: "is required for a new platform (" + name + " does not exist)"})
		}
		created = true
		cur = Platform{Name: name}.WithDefaults()
	case err != nil:
		return Platform{}, false, fmt.Errorf("platform: set %s: %w", name, err)
	}
	// Validated as given: an explicit 0 is an error, not "the default".
	p = u.Apply(cur)
	if err := p.Validate(); err != nil {
		return Platform{}, false, fmt.Errorf("platform: %w", err)
	}
	if p, err = SetPlatform(ctx, tx, p); err != nil {
		return Platform{}, false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Platform{}, false, fmt.Errorf("platform: set %s: %w", name, err)
	}
	return p, created, nil
}

// ErrHasSources is wrapped by DeletePlatform's refusal to delete a platform
// that still has sources (an ErrInvalid: the caller did not ask for them to
// go too).
var ErrHasSources = errors.New("platform has sources")

// PlatformDeletion is what DeletePlatform deleted.
type PlatformDeletion struct {
	Platform string `json:"platform"`
	Sources  int64  `json:"sources"`  // sources deleted with it
	History  int64  `json:"history"`  // history rows (checks) of the platform deleted
	Cooldown bool   `json:"cooldown"` // its cooldown row (active or remembered for escalation)
}

// DeletePlatform deletes a platform and its pacer state (the pace row, by
// the foreign key's cascade), its cooldown and its history, in one
// transaction. A platform that still has sources is refused (an error
// wrapping ErrHasSources and ErrInvalid) unless withSources, which deletes
// them too. An unknown platform wraps ErrNotFound. Fetch jobs already
// queued for its sources are cancelled when they run (the pacer no longer
// knows the platform).
func DeletePlatform(ctx context.Context, db Beginner, name string, withSources bool) (PlatformDeletion, error) {
	d := PlatformDeletion{Platform: name}
	tx, err := db.Begin(ctx)
	if err != nil {
		return d, fmt.Errorf("platform: delete %s: %w", name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if _, err := queryRow(ctx, tx, scanPlatform, lockPlatformSQL, name); errors.Is(err, pgx.ErrNoRows) {
		return d, fmt.Errorf("platform %q: %w", name, ErrNotFound)
	} else if err != nil {
		return d, fmt.Errorf("platform: delete %s: %w", name, err)
	}
	if !withSources {
		var n int64
		if err := tx.QueryRow(ctx, countPlatformSourcesSQL, name).Scan(&n); err != nil {
			return d, fmt.Errorf("platform: delete %s: %w", name, err)
		}
		if n > 0 {
			return d, fmt.Errorf("platform %s: %w", name, &FieldError{Field: "with_sources", Value: "false",
				Reason: fmt.Sprintf("must be set to delete a platform that has sources (%d); nothing deleted", n), Err: ErrHasSources})
		}
	}
	var cooldowns, platforms int64
	if err := tx.QueryRow(ctx, deletePlatformSQL, name).Scan(&d.Sources, &d.History, &cooldowns, &platforms); err != nil {
		return d, fmt.Errorf("platform: delete %s: %w", name, err)
	}
	d.Cooldown = cooldowns > 0
	if err := tx.Commit(ctx); err != nil {
		return d, fmt.Errorf("platform: delete %s: %w", name, err)
	}
	return d, nil
}
