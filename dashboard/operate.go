package dashboard

// The actions that issue 11's operations (package control, sources'
// ClearCooldown and SetEnabled) will carry out once main has them. Until
// then these minimal statements of the dashboard's own do the part that
// needs no other package: they end the cooldown and the hold, and flip a
// source's enabled flag, but wake no snoozed job (that is River's table,
// package queue's).

import (
	"context"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/pacer"
)

// clearCooldown ends a platform's cooldown (forgetting its escalation)
// and its fleet-wide hold at once, in one transaction.
func (h *Handler) clearCooldown(ctx context.Context, r *http.Request) (string, error) {
	name := r.PathValue("name")
	err := h.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, clearCooldownSQL, name); err != nil {
			return err
		}
		return pacer.ClearHold(ctx, tx, name)
	})
	if err != nil {
		return "", err
	}
	return "cleared", nil
}

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
	tag, err := h.cfg.DB.Exec(ctx, setEnabledSQL, id, enabled)
	if err != nil {
		return "", err
	}
	if tag.RowsAffected() == 0 {
		return "", notFoundf("source %d", id)
	}
	if enabled {
		return "enabled", nil
	}
	return "disabled", nil
}

// inTx runs fn in a transaction and commits it.
func (h *Handler) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := h.cfg.DB.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
