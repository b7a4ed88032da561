package sources

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Keys: a platform may limit each key of its sources (Source.Key) as well
// as the whole (Platform.KeyRate, KeyBurst, KeyMaxInFlight), and single keys
// may have limits of their own (KeyLimit, in fleetpace_key_limit). The pacer
// keeps a pace row per key in use (package pacer); ListKeys and KeyStats
// read what is in force there.

// KeyLimit is one key's own limits on a platform; a nil field is the
// platform's per-key setting.
type KeyLimit struct {
	Platform    string   `json:"platform"`
	Key         string   `json:"key"`
	Rate        *float64 `json:"rate_per_sec"`  // requests per second of this key
	Burst       *int     `json:"burst"`         // requests back to back
	MaxInFlight *int     `json:"max_in_flight"` // requests open at once (0: no cap)
}

// KeyLimitUpdate is a change to a key's limits: nil fields stay as they are
// (for a key without limits of its own: the platform's).
type KeyLimitUpdate struct {
	Rate        *float64
	Burst       *int
	MaxInFlight *int
}

// Validate reports an invalid field, wrapping ErrInvalid.
func (u KeyLimitUpdate) Validate() error {
	switch {
	case u.Rate == nil && u.Burst == nil && u.MaxInFlight == nil:
		return &FieldError{Field: "rate", Value: "", Reason: "or burst or max_in_flight must be given: nothing to set"}
	case u.Rate != nil && !(*u.Rate >= MinRate && *u.Rate <= MaxRate):
		return &FieldError{Field: "rate", Value: fmtFloat(*u.Rate), Reason: fmt.Sprintf("must be in [%g, %g] requests per second", MinRate, MaxRate)}
	case u.Burst != nil && (*u.Burst < 1 || *u.Burst > MaxBurst):
		return &FieldError{Field: "burst", Value: strconv.Itoa(*u.Burst), Reason: fmt.Sprintf("must be in [1, %d]", MaxBurst)}
	case u.MaxInFlight != nil && (*u.MaxInFlight < 0 || *u.MaxInFlight > MaxInFlight):
		return &FieldError{Field: "max_in_flight", Value: strconv.Itoa(*u.MaxInFlight), Reason: fmt.Sprintf("must be in [0, %d] (0: no cap)", MaxInFlight)}
	}
	return nil
}

// validateKeyRef checks a platform name and a (non-empty) key.
func validateKeyRef(platform, key string) error {
	if !nameRE.MatchString(platform) {
		return &FieldError{Field: "platform", Value: platform, Reason: "must match " + NamePattern}
	}
	if key == "" {
		return &FieldError{Field: "key", Value: "", Reason: "must not be empty"}
	}
	return ValidateKey(key)
}

// SetKeyLimit sets the given limits of one key of a platform, keeping its
// others (a partial update), and returns the key's limits as saved and
// whether they are new. They take effect fleet-wide at the key's next
// reservation (its pace row follows at once, if the key is in use). Invalid
// input writes nothing and wraps ErrInvalid; an unknown platform wraps
// ErrUnknownPlatform.
func SetKeyLimit(ctx context.Context, db DBTX, platform, key string, u KeyLimitUpdate) (KeyLimit, bool, error) {
	if err := validateKeyRef(platform, key); err != nil {
		return KeyLimit{}, false, fmt.Errorf("key limit: %w", err)
	}
	if err := u.Validate(); err != nil {
		return KeyLimit{}, false, fmt.Errorf("key limit: %w", err)
	}
	var (
		l       = KeyLimit{Platform: platform, Key: key}
		created bool
	)
	err := db.QueryRow(ctx, setKeyLimitSQL, platform, key, u.Rate, u.Burst, u.MaxInFlight).
		Scan(&l.Rate, &l.Burst, &l.MaxInFlight, &created)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23503" { // foreign_key_violation
		return KeyLimit{}, false, fmt.Errorf("key limit: %w", UnknownPlatform(platform))
	}
	if err != nil {
		return KeyLimit{}, false, fmt.Errorf("key limit: set %s %q: %w", platform, key, err)
	}
	return l, created, nil
}

// DeleteKeyLimit removes a key's own limits: the key follows its
// platform's per-key settings again. A key without limits of its own (or an
// unknown platform) wraps ErrNotFound.
func DeleteKeyLimit(ctx context.Context, db DBTX, platform, key string) error {
	if err := validateKeyRef(platform, key); err != nil {
		return fmt.Errorf("key limit: %w", err)
	}
	tag, err := db.Exec(ctx, deleteKeyLimitSQL, platform, key)
	if err != nil {
		return fmt.Errorf("key limit: delete %s %q: %w", platform, key, err)
	}
	if tag.RowsAffected() == 0 {
		if _, err := GetPlatform(ctx, db, platform); err != nil {
			return fmt.Errorf("key limit: %w", err)
		}
		return fmt.Errorf("key %q of platform %s has no limits of its own: %w", clip(key, maxShownValue), platform, ErrNotFound)
	}
	return nil
}

// KeyState is what is in force for one key of a platform: its limits (its
// own, else the platform's per-key settings) and, while the key is in use
// (it has a pace row), its hold, its pace and its open requests.
type KeyState struct {
	Key         string  `json:"key"`
	Rate        float64 `json:"rate_per_sec"` // in force: the key's own, else the platform's per-key rate, else the platform's
	Burst       int     `json:"burst"`
	MaxInFlight int     `json:"max_in_flight"` // 0: no cap
	// Own is the key's own limits (fleetpace_key_limit), nil when it has none.
	Own *KeyLimit `json:"own,omitempty"`
	// InUse: the key has a pace row (it was reserved lately; idle keys'
	// rows are removed, pacer.PruneKeys).
	InUse bool `json:"in_use"`
	// Hold is how long the key's fleet-wide hold still lasts (a 429 with a
	// Retry-After for it, its exhausted quota), and why.
	Hold       time.Duration `json:"-"`
	HoldReason string        `json:"hold_reason,omitempty"`
	// EffectiveRate is the pace of its last reservation (requests/s; the
	// announced quota's, if slower); Slowed is true when that is more than
	// SlowedRatio under Rate.
	EffectiveRate float64 `json:"effective_rate_per_sec"`
	Slowed        bool    `json:"slowed"`
	// InFlight is how many of its requests are open now (leases not given
	// back and not expired; counted only where a cap is in force).
	InFlight int `json:"in_flight"`
}

// SlowedRatio is how far under its rate a key's pace must be to count as
// slowed (KeyState.Slowed): 10 %.
const SlowedRatio = 0.1

// DefaultKeyListLimit is how many keys ListKeys returns by default, and
// MaxKeyListLimit the most.
const (
	DefaultKeyListLimit = 100
	MaxKeyListLimit     = 10_000
)

// KeyListOptions selects a page of a platform's keys: those after After
// (in key order), at most Limit (0: DefaultKeyListLimit).
type KeyListOptions struct {
	After string
	Limit int
}

// Validate reports an invalid field, wrapping ErrInvalid.
func (o KeyListOptions) Validate() error {
	if o.Limit < 0 || o.Limit > MaxKeyListLimit {
		return &FieldError{Field: "limit", Value: strconv.Itoa(o.Limit), Reason: fmt.Sprintf("must be in [1, %d] (0: default)", MaxKeyListLimit)}
	}
	return ValidateKey(o.After)
}

// KeyPage is a page of a platform's keys; Next is the After of the next
// page ("" on the last).
type KeyPage struct {
	Platform string     `json:"platform"`
	Keys     []KeyState `json:"keys"`
	Next     string     `json:"next,omitempty"`
}

// ListKeys returns a page of a platform's keys that are in use or have
// limits of their own, in key order, with what is in force for each. An
// unknown platform wraps ErrNotFound.
func ListKeys(ctx context.Context, db DBTX, platform string, o KeyListOptions) (KeyPage, error) {
	page := KeyPage{Platform: platform, Keys: []KeyState{}}
	if !nameRE.MatchString(platform) {
		return page, fmt.Errorf("keys: %w", &FieldError{Field: "platform", Value: platform, Reason: "must match " + NamePattern})
	}
	if err := o.Validate(); err != nil {
		return page, fmt.Errorf("keys: %w", err)
	}
	if o.Limit == 0 {
		o.Limit = DefaultKeyListLimit
	}
	if _, err := GetPlatform(ctx, db, platform); err != nil {
		return page, fmt.Errorf("keys: %w", err)
	}
	keys, err := queryRows(ctx, db, scanKeyState, listKeysSQL, platform, o.After, o.Limit+1)
	if err != nil {
		return page, fmt.Errorf("keys: list %s: %w", platform, err)
	}
	if len(keys) > o.Limit {
		keys = keys[:o.Limit]
		page.Next = keys[len(keys)-1].Key
	}
	for i := range keys {
		if keys[i].Own != nil {
			keys[i].Own.Platform = platform
		}
	}
	page.Keys = keys
	return page, nil
}

// scanKeyState reads a row of keyStateColumns.
func scanKeyState(row pgx.CollectableRow) (KeyState, error) {
	var (
		k                            KeyState
		own                          bool
		ownRate                      *float64
		ownBurst, ownMax             *int
		hold, lastI, announcedI      float64
		burst, maxInFlight, inFlight int32
	)
	err := row.Scan(&k.Key, &k.Rate, &burst, &maxInFlight, &own, &ownRate, &ownBurst, &ownMax, &k.InUse,
		&hold, &k.HoldReason, &lastI, &announcedI, &inFlight)
	if err != nil {
		return k, err
	}
	k.Burst, k.MaxInFlight, k.InFlight = int(burst), int(maxInFlight), int(inFlight)
	if own {
		k.Own = &KeyLimit{Key: k.Key, Rate: ownRate, Burst: ownBurst, MaxInFlight: ownMax}
	}
	k.Hold = seconds(hold)
	if k.Hold == 0 {
		k.HoldReason = ""
	}
	k.EffectiveRate = k.Rate
	if i := math.Max(lastI, announcedI); k.InUse && i > 0 {
		k.EffectiveRate = math.Min(k.Rate, 1/i)
	}
	k.Slowed = k.InUse && k.EffectiveRate < k.Rate*(1-SlowedRatio)
	return k, nil
}

// PlatformKeys is a platform's keys in aggregate, for status and /metrics:
// how many are in use, held and slowed, their open requests, and the few
// under the most pressure (bounded: KeyStats' top).
type PlatformKeys struct {
	Platform string `json:"platform"`
	InUse    int    `json:"in_use"`
	Held     int    `json:"held"`
	Slowed   int    `json:"slowed"`
	// InFlight is the keys' open requests (counted where a key's cap is in
	// force); PlatformInFlight the platform's (where its cap is).
	InFlight         int `json:"in_flight"`
	PlatformInFlight int `json:"platform_in_flight"`
	// Top is the keys under the most pressure, at most KeyStats' top: held
	// longest first, then slowed most, then most in flight. Keys without
	// any of these are not listed.
	Top []KeyState `json:"top"`
}

// DefaultTopKeys is how many keys per platform KeyStats lists by default.
const DefaultTopKeys = 10

// MaxTopKeys bounds KeyStats' top (the cardinality of per-key metrics).
const MaxTopKeys = 1000

// KeyStats returns, for every platform with keys in use or with a cap on
// open requests, its keys in aggregate and its top keys under pressure (at
// most top of them; 0: DefaultTopKeys; negative: none). One statement over
// the pace rows.
func KeyStats(ctx context.Context, db DBTX, top int) ([]PlatformKeys, error) {
	switch {
	case top == 0:
		top = DefaultTopKeys
	case top < 0:
		top = 0
	case top > MaxTopKeys:
		return nil, fmt.Errorf("keys: %w", &FieldError{Field: "top", Value: strconv.Itoa(top), Reason: fmt.Sprintf("must be in [0, %d]", MaxTopKeys)})
	}
	rows, err := db.Query(ctx, keyStatsSQL, top, SlowedRatio)
	if err != nil {
		return nil, fmt.Errorf("keys: stats: %w", err)
	}
	defer rows.Close()
	var out []PlatformKeys
	for rows.Next() {
		var (
			pk                            PlatformKeys
			inUse, held, slowed, kIn, pIn int64
			topKeys                       []string
			topRates, topHolds, topEff    []float64
			topBursts, topMax, topIn      []int32
			topReasons                    []string
		)
		if err := rows.Scan(&pk.Platform, &inUse, &held, &slowed, &kIn, &pIn,
			&topKeys, &topRates, &topBursts, &topMax, &topHolds, &topReasons, &topEff, &topIn); err != nil {
			return nil, fmt.Errorf("keys: stats: %w", err)
		}
		pk.InUse, pk.Held, pk.Slowed, pk.InFlight, pk.PlatformInFlight = int(inUse), int(held), int(slowed), int(kIn), int(pIn)
		pk.Top = make([]KeyState, len(topKeys))
		for i := range topKeys {
			k := KeyState{Key: topKeys[i], Rate: topRates[i], Burst: int(topBursts[i]), MaxInFlight: int(topMax[i]),
				InUse: true, Hold: seconds(topHolds[i]), HoldReason: topReasons[i], EffectiveRate: topEff[i], InFlight: int(topIn[i])}
			if k.Hold == 0 {
				k.HoldReason = ""
			}
			k.Slowed = k.EffectiveRate < k.Rate*(1-SlowedRatio)
			pk.Top[i] = k
		}
		out = append(out, pk)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("keys: stats: %w", err)
	}
	return out, nil
}
