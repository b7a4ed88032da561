package cli

import (
	"net"
	"net/url"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace/dashboard"
	"github.com/fleetpace/fleetpace/queue"
)

func (a *app) dashboardCmd() *cobra.Command {
	var addr, token string
	cmd := &cobra.Command{
		Use:   "dashboard",
		Short: "Serve the web dashboard (and River UI) on --http-addr without running a worker",
		Long: `Serve the web dashboard — every platform's ceiling, effective rate, what
decides it, pauses, cooldowns and holds with their reasons, due, queued and
failing sources, staleness, the live workers — and River UI at /riverui/,
without running a worker: for an operator's laptop pointed at the production
database (--database-url). Every worker serves the same dashboard at / on
its own --http-addr.

Actions (pause, resume, clear a cooldown, change rate and burst, disable and
enable a source) are off unless --admin-token (or FLEETPACE_ADMIN_TOKEN) is
set; a browser then signs in with the token once per session, and River UI
is behind the same sign-in. The
dashboard listens on loopback by default; listening beyond it without a
token prints a warning. Stop it with Ctrl-C or SIGTERM.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, _, err := net.SplitHostPort(addr); err != nil {
				return usagef("--http-addr: %q is not host:port: %v", addr, err)
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				client, err := queue.NewClient(pool, queue.Config{Logger: a.logger})
				if err != nil {
					return err
				}
				return dashboard.Serve(cmd.Context(), dashboard.ServerConfig{
					Dashboard:   dashboard.Config{DB: pool, AdminToken: token, Logger: a.logger},
					Addr:        addr,
					RiverClient: client,
					Ready: func(bound net.Addr) {
						u := url.URL{Scheme: "http", Host: bound.String(), Path: "/"}
						a.announce("dashboard at %s", u.String())
					},
				})
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "http-addr", dashboard.DefaultAddr, "address the dashboard (and River UI at /riverui/) listens on")
	f.StringVar(&token, "admin-token", "", "turns the dashboard's actions on, behind a sign-in with this token that River UI then needs too (default: read-only)")
	return cmd
}
