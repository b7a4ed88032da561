package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace"
	"github.com/fleetpace/fleetpace/internal/pgembed"
)

func (a *app) schemaCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "schema",
		Short: "Apply or print the database schema (fleetpace's tables and River's)",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "apply",
		Short: "Create fleetpace's tables and run River's migrations; idempotent and safe to run concurrently",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				res, err := fleetpace.Apply(cmd.Context(), pool, a.logger)
				if err != nil {
					return dbError(err)
				}
				if len(res.RiverVersions) > 0 {
					fmt.Fprintf(a.stdout, "schema applied (River migrations %v)\n", res.RiverVersions)
				} else {
					fmt.Fprintln(a.stdout, "schema applied (already current)")
				}
				return nil
			})
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "print",
		Short: "Print fleetpace's own schema (migrations-free-schema.sql)",
		Args:  noArgs,
		// No database needed.
		PersistentPreRunE: func(*cobra.Command, []string) error { return nil },
		RunE: func(*cobra.Command, []string) error {
			_, err := io.WriteString(a.stdout, fleetpace.Schema)
			return err
		},
	})
	return cmd
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), strings.Join(args, " "))
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (a *app) embeddedCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "embedded",
		Short: "Manage the local embedded PostgreSQL cluster (used when no database URL is given)",
	}
	noDB := func(cmd *cobra.Command, _ []string) error { return a.setup(cmd) }
	cmd.AddCommand(&cobra.Command{
		Use:               "status",
		Short:             "Show whether the embedded cluster under --data-dir is running",
		Args:              noArgs,
		PersistentPreRunE: noDB,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := pgembed.Attach(pgembed.Config{DataDir: a.dataDir})
			if errors.Is(err, pgembed.ErrNotRunning) {
				fmt.Fprintf(a.stdout, "embedded PostgreSQL in %s: not running\n", a.dataDir)
				return nil
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "embedded PostgreSQL in %s: running on 127.0.0.1:%d (database %s)\n", a.dataDir, c.Port(), pgembed.DatabaseName)
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "url",
		Short: "Print the embedded cluster's database URL (starting it and applying the schema if needed)",
		Long: `Print the URL of the embedded cluster's database under --data-dir — for
DATABASE_URL, or a program using fleetpace as a library (pacer.Config's
DatabaseURL) — starting the cluster if it is not running and applying the
schema, so the URL works at once. It ignores --database-url and
DATABASE_URL. Only the URL goes to stdout:

  export DATABASE_URL=$(fleetpace embedded url)`,
		Args:              noArgs,
		PersistentPreRunE: noDB,
		RunE: func(cmd *cobra.Command, _ []string) error {
			url, err := a.embeddedURL(cmd.Context())
			if err != nil {
				return dbError(err)
			}
			fmt.Fprintln(a.stdout, url)
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:               "stop",
		Short:             "Stop the embedded cluster under --data-dir (its data is kept)",
		Args:              noArgs,
		PersistentPreRunE: noDB,
		RunE: func(cmd *cobra.Command, _ []string) error {
			was, err := pgembed.StopShared(cmd.Context(), a.dataDir, pgembed.Config{})
			if err != nil {
				return err
			}
			if was {
				fmt.Fprintf(a.stdout, "embedded PostgreSQL in %s stopped\n", a.dataDir)
			} else {
				fmt.Fprintf(a.stdout, "embedded PostgreSQL in %s was not running\n", a.dataDir)
			}
			return nil
		},
	})
	return cmd
}
