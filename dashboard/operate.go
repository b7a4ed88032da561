package dashboard

import (
	"context"
	"net/http"

	"github.com/fleetpace/fleetpace/pacer"
)

// clearCooldown ends a platform's fleet-wide hold at once.
func (h *Handler) clearCooldown(ctx context.Context, r *http.Request) (string, error) {
	if err := pacer.ClearHold(ctx, h.cfg.DB, r.PathValue("name")); err != nil {
		return "", err
	}
	return "cleared", nil
}

func (h *Handler) enableSource(ctx context.Context, r *http.Request) (string, error) {
	return "", badf("not yet")
}

func (h *Handler) disableSource(ctx context.Context, r *http.Request) (string, error) {
	return "", badf("not yet")
}
