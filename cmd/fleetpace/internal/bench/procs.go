package bench

import (
	"context"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/dbconn"
)

// procEnv opens what a benchmark of worker processes needs: its working
// directory (dir, or a temporary one named after name that release
// removes) and a small pool on url for its own queries. release closes
// and removes what procEnv made.
func procEnv(ctx context.Context, url, dir, name string) (string, *pgxpool.Pool, func(), error) {
	var tmp string
	if dir == "" {
		d, err := os.MkdirTemp("", "fleetpace-bench-"+name+"-")
		if err != nil {
			return "", nil, nil, err
		}
		dir, tmp = d, d
	}
	pool, err := dbconn.NewPool(ctx, dbconn.Config{URL: url, MaxConns: 4})
	if err != nil {
		if tmp != "" {
			os.RemoveAll(tmp)
		}
		return "", nil, nil, err
	}
	return dir, pool, func() {
		pool.Close()
		if tmp != "" {
			os.RemoveAll(tmp)
		}
	}, nil
}
