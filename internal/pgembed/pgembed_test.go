package pgembed_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/internal/pgembed"
)

func TestMissingBinariesGiveAnInstallHint(t *testing.T) {
	t.Parallel()
	_, err := pgembed.Start(context.Background(), pgembed.Config{BinDir: t.TempDir()})
	if !errors.Is(err, pgembed.ErrBinariesNotFound) || !strings.Contains(err.Error(), "apt-get install postgresql") {
		t.Fatalf("err = %v, want ErrBinariesNotFound with an install hint", err)
	}
}

func TestStartStopRestartClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := pgembed.Start(ctx, pgembed.Config{})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(c.DataDir())
	ping := func() error {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	}
	if err := ping(); err != nil {
		t.Fatal(err)
	}
	port := c.Port()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if ping() == nil {
		t.Fatal("server still answers after Stop")
	}
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Port() != port || ping() != nil {
		t.Fatalf("restart: port %d (was %d), ping %v", c.Port(), port, ping())
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("temporary cluster directory %s left behind (%v)", root, err)
	}
}
