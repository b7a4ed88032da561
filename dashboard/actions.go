package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fleetpace/fleetpace/control"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/sources"
)

// DefaultPauseReason is a pause's reason when the form gives none.
const DefaultPauseReason = "paused from the dashboard"

// notices are the messages shown after an action (?done=…): a fixed set,
// so a link cannot put words on the page.
var notices = map[string]string{
	"paused":    "Paused: no request leaves for this platform from any worker until it is resumed or the pause ends.",
	"resumed":   "Resumed.",
	"notpaused": "It was not paused: nothing changed.",
	"cleared":   "Cooldown and hold cleared: the platform is fetched again at once, fleet-wide.",
	"limits":    "Rate and burst changed; every worker paces by them from its next reservation.",
	"reset":     "Reset: no backoff, estimate, hold, cooldown or announced quota is left; the platform is fetched at its configured pace from now, fleet-wide (a pause stays).",
	"checked":   "Checked now: its sources without a job got one and its waiting jobs run now, at the platform's pace.",
	"checking":  "Checked now: the source's job runs as soon as the platform's pace allows.",
	"enabled":   "Source enabled.",
	"disabled":  "Source disabled: it is no longer scanned.",
}

// actionFunc carries out one action and returns its notice's key.
type actionFunc func(ctx context.Context, r *http.Request) (done string, err error)

// action serves a POST action: refused (403) when the dashboard has no
// admin token, without a signed-in session or without the session's CSRF
// token (the guard has already refused cross-origin requests, other
// bodies than forms and bodies over MaxBodyBytes); then bad input is a 400
// naming the field (nothing written), a missing platform or source a 404.
// A done action redirects (303) back to the page it came from.
func (h *Handler) action(fn actionFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b := h.base(w, r)
		b.Title = "Action refused"
		if h.refused(w, r, b) {
			return
		}
		s, ok := sessionOf(r)
		if !ok {
			h.fail(w, r, b, http.StatusForbidden, "sign in with the admin token first")
			return
		}
		if !h.readForm(w, r, b) {
			return
		}
		if !h.session.checkCSRF(s, r.PostFormValue("csrf")) {
			h.fail(w, r, b, http.StatusForbidden, "the form's CSRF token is missing or wrong: reload the page and try again")
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), h.cfg.QueryTimeout)
		defer cancel()
		done, err := fn(ctx, r)
		var bad *badRequest
		switch {
		case err == nil:
		case r.Context().Err() != nil:
			h.cfg.Logger.Info("dashboard: client went away during an action", "path", r.URL.Path, "err", redact.Text(err.Error()))
			return
		case errors.Is(err, errNotFound), errors.Is(err, sources.ErrNotFound), errors.Is(err, pacer.ErrUnknownPlatform):
			b.Title = "Not found"
			h.fail(w, r, b, http.StatusNotFound, err.Error())
			return
		case errors.As(err, &bad), errors.Is(err, sources.ErrInvalid):
			b.Title = "Bad input"
			h.fail(w, r, b, http.StatusBadRequest, err.Error())
			return
		case dbconn.IsUnavailable(err):
			h.unreachable(w, r, b, "nothing was done", err)
			return
		default:
			h.cfg.Logger.Error("dashboard: action failed", "path", r.URL.Path, "err", redact.Text(err.Error()))
			b.Title = "Action failed"
			h.fail(w, r, b, http.StatusInternalServerError, redact.Text(err.Error()))
			return
		}
		h.cfg.Logger.Info("dashboard: action", "path", r.URL.Path, "done", done, "remote", h.clientAddr(r))
		http.Redirect(w, r, withNotice(localPath(r.PostFormValue("back")), done), http.StatusSeeOther)
	}
}

// readForm parses a POST's form (its body bounded by the guard) and
// answers 413 for a body too large, 400 for a malformed one or a value
// PostgreSQL cannot store (not UTF-8, or a NUL); it reports whether the
// form may be used.
func (h *Handler) readForm(w http.ResponseWriter, r *http.Request, b *Base) bool {
	err := r.ParseForm()
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		h.fail(w, r, b, http.StatusRequestEntityTooLarge, fmt.Sprintf("the form is larger than %d bytes", tooLarge.Limit))
		return false
	case err != nil:
		h.fail(w, r, b, http.StatusBadRequest, "the form cannot be read")
		return false
	}
	for k, vs := range r.PostForm {
		for _, v := range append(vs, k) {
			if !cleanText(v) {
				h.fail(w, r, b, http.StatusBadRequest, "every field of the form must be UTF-8 without NUL characters")
				return false
			}
		}
	}
	return true
}

// unreachable answers 503 (Retry-After: 1) for what could not be done
// because the database is unreachable.
func (h *Handler) unreachable(w http.ResponseWriter, r *http.Request, b *Base, what string, err error) {
	b.Title = "Database unreachable"
	w.Header().Set("Retry-After", "1")
	h.fail(w, r, b, http.StatusServiceUnavailable, what+": the database is unreachable: "+redact.Text(err.Error()))
}

// refused answers 403 to a POST when actions are off, and reports whether
// it did.
func (h *Handler) refused(w http.ResponseWriter, r *http.Request, b *Base) bool {
	if h.session != nil {
		return false
	}
	h.fail(w, r, b, http.StatusForbidden, "actions are off: start the server with --admin-token (or FLEETPACE_ADMIN_TOKEN) to turn them on")
	return true
}

// withNotice adds ?done=key to a local path.
func withNotice(p, key string) string {
	u, err := url.Parse(p)
	if err != nil {
		return "/"
	}
	q := u.Query()
	q.Set("done", key)
	u.RawQuery = q.Encode()
	return u.RequestURI()
}

// pause pauses a platform fleet-wide (control.Pause): for a duration (form
// field "for", empty: until resumed) with a reason. The duration counts
// from the database's clock, not this process's (a laptop's clock may be
// off).
func (h *Handler) pause(ctx context.Context, r *http.Request) (string, error) {
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if reason == "" {
		reason = DefaultPauseReason
	}
	o := control.PauseOptions{Reason: reason}
	if s := strings.TrimSpace(r.PostFormValue("for")); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return "", badf("for must be a positive duration such as 30m or 2h (empty: until resumed), got %q", s)
		}
		o.For = d
		if err := h.cfg.DB.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&o.Now); err != nil {
			return "", err
		}
	}
	if _, err := control.Pause(ctx, h.cfg.DB, r.PathValue("name"), o); err != nil {
		return "", err
	}
	return "paused", nil
}

// resume ends a platform's pause and wakes its snoozed fetch jobs
// (control.Resume): they run within about a second, in every worker.
func (h *Handler) resume(ctx context.Context, r *http.Request) (string, error) {
	_, err := control.Resume(ctx, h.cfg.DB, r.PathValue("name"))
	switch {
	case errors.Is(err, control.ErrNotPaused):
		return "notpaused", nil
	case err != nil:
		return "", err
	}
	return "resumed", nil
}

// clearCooldown ends a platform's cooldown and the pacer's hold at once,
// forgets its escalation and wakes its snoozed fetch jobs
// (control.ClearCooldown).
func (h *Handler) clearCooldown(ctx context.Context, r *http.Request) (string, error) {
	if _, err := control.ClearCooldown(ctx, h.cfg.DB, r.PathValue("name")); err != nil {
		return "", err
	}
	return "cleared", nil
}

// reset puts a platform back at its configured pace from a known state
// (control.Reset): cooldown, holds, backoff, estimate and announced quota
// gone, its snoozed jobs woken.
func (h *Handler) reset(ctx context.Context, r *http.Request) (string, error) {
	if _, err := control.Reset(ctx, h.cfg.DB, r.PathValue("name")); err != nil {
		return "", err
	}
	return "reset", nil
}

// checkPlatform checks every enabled source of a platform now
// (control.CheckPlatform), at the platform's pace.
func (h *Handler) checkPlatform(ctx context.Context, r *http.Request) (string, error) {
	if h.cfg.Queue == nil {
		return "", badf("checking now needs a River client: this dashboard has none")
	}
	if _, err := control.CheckPlatform(ctx, h.cfg.DB, h.cfg.Queue, r.PathValue("name")); err != nil {
		return "", err
	}
	return "checked", nil
}

// checkSource checks one source now (control.CheckSources), at its
// platform's pace.
func (h *Handler) checkSource(ctx context.Context, r *http.Request) (string, error) {
	id, err := sourceID(r)
	if err != nil {
		return "", err
	}
	if h.cfg.Queue == nil {
		return "", badf("checking now needs a River client: this dashboard has none")
	}
	c, err := control.CheckSources(ctx, h.cfg.DB, h.cfg.Queue, []int64{id})
	if err != nil {
		return "", err
	}
	if c.Disabled > 0 {
		return "", badf("source %d is disabled: enable it first", id)
	}
	return "checking", nil
}

// setLimits changes a platform's rate and burst (either may be left
// empty: unchanged), keeping every other setting (sources.ConfigurePlatform,
// a partial update). The platform must exist: the dashboard creates none.
func (h *Handler) setLimits(ctx context.Context, r *http.Request) (string, error) {
	name := r.PathValue("name")
	rateS, burstS := strings.TrimSpace(r.PostFormValue("rate")), strings.TrimSpace(r.PostFormValue("burst"))
	if rateS == "" && burstS == "" {
		return "", badf("give a rate, a burst or both")
	}
	var u sources.PlatformUpdate
	if rateS != "" {
		rate, err := strconv.ParseFloat(rateS, 64)
		if err != nil {
			return "", badf("rate must be a number of requests/s, got %q", rateS)
		}
		u.RatePerSec = &rate
	}
	if burstS != "" {
		burst, err := strconv.Atoi(burstS)
		if err != nil {
			return "", badf("burst must be a whole number, got %q", burstS)
		}
		u.Burst = &burst
	}
	if _, err := sources.GetPlatform(ctx, h.cfg.DB, name); err != nil {
		return "", err
	}
	if _, _, err := sources.ConfigurePlatform(ctx, h.cfg.DB, name, u); err != nil {
		return "", err
	}
	return "limits", nil
}

// enableSource and disableSource set a source's enabled flag
// (sources.SetEnabled).
func (h *Handler) enableSource(ctx context.Context, r *http.Request) (string, error) {
	return h.setEnabled(ctx, r, true)
}

func (h *Handler) disableSource(ctx context.Context, r *http.Request) (string, error) {
	return h.setEnabled(ctx, r, false)
}

func (h *Handler) setEnabled(ctx context.Context, r *http.Request, enabled bool) (string, error) {
	id, err := sourceID(r)
	if err != nil {
		return "", err
	}
	if _, err := sources.SetEnabled(ctx, h.cfg.DB, sources.Selection{IDs: []int64{id}}, enabled); err != nil {
		return "", err
	}
	if enabled {
		return "enabled", nil
	}
	return "disabled", nil
}

// sourceID reads the {id} of a source action.
func sourceID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		return 0, badf("source id must be a positive number, got %q", r.PathValue("id"))
	}
	return id, nil
}

func notFoundf(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errNotFound)...)
}
