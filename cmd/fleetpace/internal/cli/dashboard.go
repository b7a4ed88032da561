package cli

import (
	"net"
	"net/url"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fleetpace/fleetpace/dashboard"
	"github.com/fleetpace/fleetpace/queue"
)

func (a *app) dashboardCmd() *cobra.Command {
	var (
		addr string
		cfg  dashboard.Config
	)
	cmd := &cobra.Command{
		Use:   "dashboard",
		Short: "Serve the web dashboard (and River UI) on --http-addr without running a worker",
		Long: `Serve the web dashboard — every platform's ceiling, effective rate, what
decides it, pauses, cooldowns and holds with their reasons, due, queued and
failing sources, staleness, the live workers — and River UI at /riverui/,
without running a worker: for an operator's laptop pointed at the production
database (--database-url). Every worker serves the same dashboard at / on
its own --http-addr.

Actions (pause, resume, clear a cooldown, reset a platform's pace, check a
platform's sources or one source now, change rate and burst, disable and
enable a source) are off unless --admin-token (or FLEETPACE_ADMIN_TOKEN) is
set; a browser then signs in with the token once per session, and River UI
is behind the same sign-in. The dashboard listens on loopback by default
and answers only to the loopback names, the address it listens on and
--allowed-host. Beyond loopback, the token must be at least 32 bytes and
every page needs sign-in (--public-read keeps the pages readable);
listening beyond it without a token prints a warning. Stop it with Ctrl-C
or SIGTERM.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, _, err := net.SplitHostPort(addr); err != nil {
				return usagef("--http-addr: %q is not host:port: %v", addr, err)
			}
			if err := checkHTTPFlags(addr, cfg.AdminToken, cfg.AllowedHosts); err != nil {
				return err
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				client, err := queue.NewClient(pool, queue.Config{Logger: a.logger})
				if err != nil {
					return err
				}
				cfg.DB, cfg.Logger = pool, a.logger
				return dashboard.Serve(cmd.Context(), dashboard.ServerConfig{
					Dashboard:   cfg,
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
	addHTTPFlags(f, &cfg.AdminToken, &cfg.AllowedHosts, &cfg.PublicRead, &cfg.TrustProxyHeaders)
	return cmd
}

// addHTTPFlags registers the flags of the dashboard's server, shared by
// worker and dashboard.
func addHTTPFlags(f *pflag.FlagSet, token *string, hosts *[]string, publicRead, trustProxy *bool) {
	f.StringVar(token, "admin-token", "", "turns the dashboard's actions on, behind a sign-in with this token that River UI then needs too, and beyond loopback every page; at least 32 bytes beyond loopback (default: read-only)")
	f.StringSliceVar(hosts, "allowed-host", nil, "a host name (or address) the server answers to besides the loopback names and the address it listens on, e.g. the name of its proxy or of the machine (repeatable, or comma-separated; other Host headers get 421)")
	f.BoolVar(publicRead, "public-read", false, "with --admin-token beyond loopback, keep the pages (and /status) readable without sign-in; actions and River UI still need it")
	f.BoolVar(trustProxy, "trust-proxy-headers", false, "behind a TLS-terminating proxy: trust its X-Forwarded-Proto (https: Secure session cookie) and X-Forwarded-For (sign-in failures counted per client); only when every request comes through it")
}

// checkHTTPFlags refuses (exit 2) an admin token that cannot guard a
// server on addr, and a malformed --allowed-host, before anything starts.
// The token is never printed.
func checkHTTPFlags(addr, token string, hosts []string) error {
	if err := dashboard.CheckAdminToken(token, dashboard.ListenHost(addr)); err != nil {
		return usagef("--admin-token: %v", err)
	}
	for _, h := range hosts {
		if err := dashboard.CheckAllowedHost(h); err != nil {
			return usagef("--allowed-host: %v", err)
		}
	}
	return nil
}
