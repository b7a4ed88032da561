package sources

import "encoding/json"

// JSON keys of durations carry their unit: every duration is written in
// seconds under a key ending in _s (interval_s, cooldown_s, remaining_s,
// stale_max_s), as pacer.State's are. Each type's other fields keep their
// tags; the methods below add the durations.

// MarshalJSON writes Interval as interval_s.
func (s Source) MarshalJSON() ([]byte, error) {
	type plain Source
	return json.Marshal(struct {
		plain
		Interval float64 `json:"interval_s"`
	}{plain(s), s.Interval.Seconds()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *Source) UnmarshalJSON(b []byte) error {
	type plain Source
	j := struct {
		*plain
		Interval float64 `json:"interval_s"`
	}{plain: (*plain)(s)}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	s.Interval = seconds(j.Interval)
	return nil
}

// MarshalJSON writes Cooldown as cooldown_s.
func (p Platform) MarshalJSON() ([]byte, error) {
	type plain Platform
	return json.Marshal(struct {
		plain
		Cooldown float64 `json:"cooldown_s"`
	}{plain(p), p.Cooldown.Seconds()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (p *Platform) UnmarshalJSON(b []byte) error {
	type plain Platform
	j := struct {
		*plain
		Cooldown float64 `json:"cooldown_s"`
	}{plain: (*plain)(p)}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	p.Cooldown = seconds(j.Cooldown)
	return nil
}

// MarshalJSON writes Remaining as remaining_s.
func (c Cooldown) MarshalJSON() ([]byte, error) {
	type plain Cooldown
	return json.Marshal(struct {
		plain
		Remaining  float64 `json:"remaining_s"`
		RetryAfter float64 `json:"retry_after_s"`
	}{plain(c), c.Remaining.Seconds(), c.RetryAfter.Seconds()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (c *Cooldown) UnmarshalJSON(b []byte) error {
	type plain Cooldown
	j := struct {
		*plain
		Remaining  float64 `json:"remaining_s"`
		RetryAfter float64 `json:"retry_after_s"`
	}{plain: (*plain)(c)}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	c.Remaining, c.RetryAfter = seconds(j.Remaining), seconds(j.RetryAfter)
	return nil
}

// MarshalJSON writes StaleMax and StaleP95 as stale_max_s and stale_p95_s.
func (c PlatformCounts) MarshalJSON() ([]byte, error) {
	type plain PlatformCounts
	return json.Marshal(struct {
		plain
		StaleMax float64 `json:"stale_max_s"`
		StaleP95 float64 `json:"stale_p95_s"`
	}{plain(c), c.StaleMax.Seconds(), c.StaleP95.Seconds()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (c *PlatformCounts) UnmarshalJSON(b []byte) error {
	type plain PlatformCounts
	j := struct {
		*plain
		StaleMax float64 `json:"stale_max_s"`
		StaleP95 float64 `json:"stale_p95_s"`
	}{plain: (*plain)(c)}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	c.StaleMax, c.StaleP95 = seconds(j.StaleMax), seconds(j.StaleP95)
	return nil
}

// MarshalJSON writes Hold as hold_s.
func (k KeyState) MarshalJSON() ([]byte, error) {
	type plain KeyState
	return json.Marshal(struct {
		plain
		Hold float64 `json:"hold_s"`
	}{plain(k), k.Hold.Seconds()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (k *KeyState) UnmarshalJSON(b []byte) error {
	type plain KeyState
	j := struct {
		*plain
		Hold float64 `json:"hold_s"`
	}{plain: (*plain)(k)}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	k.Hold = seconds(j.Hold)
	return nil
}
