package bench

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/testdb"
)

const pacerChildArgsEnv = "FLEETPACE_BENCH_PACER_CHILD_ARGS"

// TestPacerChildHelper is not a test: it is the body of the accuracy child
// processes, started by re-executing the test binary.
func TestPacerChildHelper(t *testing.T) {
	raw := os.Getenv(pacerChildArgsEnv)
	if raw == "" {
		return
	}
	var args []string
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		os.Stderr.WriteString(err.Error())
		os.Exit(2)
	}
	if err := PacerChild(context.Background(), args, os.Stdout); err != nil {
		os.Stderr.WriteString(err.Error())
		os.Exit(1)
	}
	os.Exit(0)
}

func pacerTestSpawn(args []string) *exec.Cmd {
	b, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0], "-test.run=^TestPacerChildHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), pacerChildArgsEnv+"="+string(b))
	return cmd
}

// The pacer benchmark runs end to end with tiny sizes and reports sane
// figures; FLEETPACE_BENCH_PACER_FULL=1 runs it at full size and prints it.
func TestPacerBench(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the pacer benchmark with child processes")
	}
	cfg := PacerConfig{
		DatabaseURL:        testdb.URL(t),
		Spawn:              pacerTestSpawn,
		LatencySamples:     200,
		ThroughputDuration: 200 * time.Millisecond,
		Processes:          2,
		Goroutines:         2,
		AccuracyDuration:   3 * time.Second,
	}
	full := os.Getenv("FLEETPACE_BENCH_PACER_FULL") != ""
	if full {
		cfg = PacerConfig{DatabaseURL: cfg.DatabaseURL, Spawn: pacerTestSpawn, Progress: os.Stderr}
	}
	res, err := Pacer(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	if err := res.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + text.String())
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(string(b))
	var fields map[string]any
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"select1_p50_ms", "upsert_p50_ms", "reserve_p50_ms", "reserve_p99_ms",
		"upsert_tps_4", "reserve_tps_4", "accuracy_ratio", "max_window", "ceiling", "burst"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	for name, v := range map[string]float64{
		"select1_p50": res.Select1P50, "upsert_p50": res.UpsertP50, "reserve_p50": res.ReserveP50,
		"upsert_tps_4": res.UpsertTPS4, "reserve_tps_1": res.ReserveTPS1, "reserve_tps_4": res.ReserveTPS4, "reserve_tps_16": res.ReserveTPS16,
		"reserve_block_tps_4": res.BlockTPS4,
	} {
		if !(v > 0) || math.IsInf(v, 0) {
			t.Errorf("%s = %v, want a positive figure", name, v)
		}
	}
	// Blocks at an unlimited rate hand out most slots without a round trip:
	// they must beat one statement per reservation by far.
	if res.BlockTPS4 < 3*res.ReserveTPS4 {
		t.Errorf("reservations in blocks %v/s, one statement each %v/s: want blocks ≥ 3× faster", res.BlockTPS4, res.ReserveTPS4)
	}
	if res.ReserveP99 < res.ReserveP50 {
		t.Errorf("reserve p99 %v < p50 %v", res.ReserveP99, res.ReserveP50)
	}
	if res.Ceiling != 50 || res.Burst != 2 {
		t.Errorf("ceiling %v burst %v, want the defaults 50 and 2", res.Ceiling, res.Burst)
	}
	// Even a 3-s run must deliver close to the ceiling and never exceed it.
	if res.AccuracyRatio < 0.9 || res.AccuracyRatio > 1.1 {
		t.Errorf("accuracy ratio %v, want about 1", res.AccuracyRatio)
	}
	if float64(res.MaxWindow) > res.Ceiling+float64(res.Burst) {
		t.Errorf("largest window %d > ceiling + burst", res.MaxWindow)
	}
	// The benchmark removed its platforms and their pace rows.
	pool, err := pgxpool.New(context.Background(), cfg.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var left int
	if err := pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM fleetpace_platform WHERE name LIKE 'bench-%')
		     + (SELECT count(*) FROM fleetpace_pace WHERE platform LIKE 'bench-%')`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("the benchmark left %d bench- rows behind", left)
	}
}
