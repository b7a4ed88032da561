package pacer

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/testdb"
)

// BenchmarkReserve measures a reservation at an unlimited rate side by side
// with a bare single-row upsert of the same shape (the physical limit of one
// row) and SELECT 1 (the round-trip floor), each with 4 parallel callers:
//
//	go test ./pacer -run '^$' -bench . -cpu 4
//
// `fleetpace bench pacer` reports the same comparison with more figures.
func BenchmarkReserve(b *testing.B) {
	ctx := context.Background()
	url := testdb.URL(b)
	pool, err := pgxpool.New(ctx, url+"&application_name=bench")
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `INSERT INTO fleetpace_platform (name, rate_per_sec) VALUES ('u', 1e9), ('bare', 1e9)`); err != nil {
		b.Fatal(err)
	}
	p, err := New(ctx, Config{DatabaseURL: url, MaxConns: 8})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()

	b.Run("select1", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				var one int
				if err := pool.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("upsert", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				var c float64
				err := pool.QueryRow(ctx, `INSERT INTO fleetpace_pace AS s (platform, cursor_at)
VALUES ('bare', extract(epoch FROM clock_timestamp()))
ON CONFLICT (platform, key) DO UPDATE SET cursor_at = GREATEST(s.cursor_at, EXCLUDED.cursor_at) + 0.000001
RETURNING s.cursor_at`).Scan(&c)
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("reserve", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r, err := p.Reserve(ctx, "u", time.Second)
				if err != nil || !r.Granted {
					b.Fatal(r, err)
				}
			}
		})
	})
}
