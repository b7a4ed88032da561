package dashboard

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Windows of the history charts and lists.
const (
	sparkWindow  = 15 * time.Minute
	sparkBucket  = 30 * time.Second
	chartWindow  = time.Hour
	chartBucket  = time.Minute
	historyShown = 50
)

// Check is one fetch of a source, from the history.
type Check struct {
	At       time.Time
	Outcome  string
	Status   int
	Duration time.Duration
	Bytes    int64
	Reason   string
	Worker   string
}

const noHistory = "no fetch history is kept by this version"

func (h *Handler) sparklines(ctx context.Context, tx pgx.Tx, rows []PlatformRow) (string, error) {
	return noHistory, nil
}

func (h *Handler) platformChart(ctx context.Context, tx pgx.Tx, row PlatformRow) (*Chart, string, error) {
	return nil, noHistory, nil
}

func (h *Handler) sourceHistory(ctx context.Context, tx pgx.Tx, id int64, n int) ([]Check, string, error) {
	return nil, noHistory, nil
}
