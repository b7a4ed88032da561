package dashboard

import (
	"fmt"
	"html/template"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/status"
)

// funcs are the templates' formatting functions.
var funcs = template.FuncMap{
	"rate": rateText,
	"dur":  durText,
	"ms":   func(d time.Duration) string { return strconv.FormatFloat(ms(d), 'f', 1, 64) + " ms" },
	"mult": multText,
	"ago": func(now time.Time, t any) string {
		var at time.Time
		switch v := t.(type) {
		case time.Time:
			at = v
		case *time.Time:
			if v != nil {
				at = *v
			}
		}
		if at.IsZero() {
			return "never"
		}
		return durText(now.Sub(at)) + " ago"
	},
	"at": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	// untilMS is the epoch milliseconds at which a countdown of d from now
	// ends (the script ticks it; without it the text stays as rendered).
	"untilMS": func(now time.Time, d time.Duration) int64 { return now.Add(d).UnixMilli() },
	"epochMS": func(t time.Time) int64 { return t.UnixMilli() },
	"query":   url.QueryEscape,
	"path":    url.PathEscape,
	"deref": func(p any) any {
		switch v := p.(type) {
		case *string:
			if v != nil {
				return *v
			}
		case *fetch.Outcome:
			if v != nil {
				return *v
			}
		case *int:
			if v != nil {
				return *v
			}
		case *int64:
			if v != nil {
				return *v
			}
		}
		return ""
	},
	"since":      func(now, t time.Time) time.Duration { return now.Sub(t) },
	"cd":         func(now time.Time, d time.Duration) countdown { return countdown{now, d} },
	"stateOf":    func(now time.Time, row PlatformRow, full bool) stateView { return stateView{now, row.State, full} },
	"conditions": func(now time.Time, cs []status.Condition) stateView { return stateView{now, cs, true} },
	"usage":      func(u status.Usage) string { return u.Text() },
	"actionsFor": func(b *Base, row PlatformRow, full bool) actionsView { return actionsView{b, row, full} },
	"redact":     redact.URL,
	"redactText": redact.Text,
	"bdi":        bdi,
	"visible":    visible,
	"sub":        func(a, b float64) float64 { return a - b },
	"add":        func(a, b float64) float64 { return a + b },
	"pacedBy":    pacedByText,
}

// Arguments of the templates' parts.
type (
	countdown struct {
		Now  time.Time
		Left time.Duration
	}
	stateView struct {
		Now   time.Time
		State []status.Condition
		Full  bool // with every condition's why, not only what stops the platform
	}
	actionsView struct {
		Base *Base
		Row  PlatformRow
		Full bool
	}
)

// bidiControls are the characters that reorder the text around them:
// the embeddings, overrides and isolates, and the marks. A value from
// outside (a URL, a reason, a host name) holding one could make what an
// operator reads differ from what it is (…/\u202Egnp.exe shows as
// …/exe.png).
var bidiControls = map[rune]bool{
	'\u061C': true, '\u200E': true, '\u200F': true,
	'\u202A': true, '\u202B': true, '\u202C': true, '\u202D': true, '\u202E': true,
	'\u2066': true, '\u2067': true, '\u2068': true, '\u2069': true,
}

// visible is s with its bidirectional control characters shown as what
// they are ("[U+202E]") instead of acting on the text.
func visible(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return bidiControls[r] }) < 0 {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if bidiControls[r] {
			fmt.Fprintf(&b, "[U+%04X]", r)
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// bdi shows a value from outside the dashboard (a name, URL, reason, host
// name, validator) as it is: its bidirectional controls made visible, and
// isolated in a <bdi> element, so neither it nor the text around it is
// reordered by the other.
func bdi(v any) template.HTML {
	return template.HTML("<bdi>" + template.HTMLEscapeString(visible(fmt.Sprint(v))) + "</bdi>")
}

// rateText is a rate in requests/s, three significant digits.
func rateText(r float64) string {
	switch {
	case math.IsInf(r, 1):
		return "unlimited"
	case math.IsNaN(r) || r <= 0:
		return "0/s"
	case r >= 100:
		return fmt.Sprintf("%.0f/s", r)
	default:
		return strconv.FormatFloat(r, 'g', 3, 64) + "/s"
	}
}

// durText is a duration, compact and rounded to what matters at its size.
func durText(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.Itoa(int(d.Round(time.Second)/time.Second)) + "s"
	case d < time.Hour:
		d = d.Round(time.Second)
		if s := int(d/time.Second) % 60; s != 0 {
			return fmt.Sprintf("%dm%02ds", int(d/time.Minute), s)
		}
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		d = d.Round(time.Minute)
		if m := int(d/time.Minute) % 60; m != 0 {
			return fmt.Sprintf("%dh%02dm", int(d/time.Hour), m)
		}
		return fmt.Sprintf("%dh", int(d/time.Hour))
	case d > 100*365*24*time.Hour:
		return "indefinitely"
	default:
		d = d.Round(time.Hour)
		return fmt.Sprintf("%dd%dh", int(d/(24*time.Hour)), int(d/time.Hour)%24)
	}
}

// pacedByText explains what decides the effective rate (pacer.State.PacedBy).
func pacedByText(by string) string {
	switch by {
	case pacer.PacedByPause:
		return "paused by an operator"
	case pacer.PacedByHold:
		return "fleet-wide hold"
	case pacer.PacedByAnnounced:
		return "rate the destination announced"
	case pacer.PacedByWindow:
		return "a fixed window learned from its refusals"
	case pacer.PacedByBackoff:
		return "ceiling ÷ backoff multiplier"
	case pacer.PacedByCeiling:
		return "the configured ceiling"
	}
	return by
}

func parseTemplates() (map[string]*template.Template, error) {
	layout, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/parts.html")
	if err != nil {
		return nil, fmt.Errorf("dashboard: templates: %w", err)
	}
	out := map[string]*template.Template{}
	for _, name := range []string{"overview", "platform", "source", "login", "error"} {
		t, err := layout.Clone()
		if err == nil {
			t, err = t.ParseFS(templateFS, "templates/"+name+".html")
		}
		if err != nil {
			return nil, fmt.Errorf("dashboard: template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// multText writes a multiplier: ×1.5.
func multText(f float64) string { return "×" + strconv.FormatFloat(f, 'g', 3, 64) }
