package pacer

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A pacer on a wrong role, or on a port nobody listens on: New succeeds
// (it does not connect), Ping says the database is unreachable and why,
// and a request that gets no slot says the database is the problem, with
// the server's reason, never a password.
func TestWrongDatabaseSaysSo(t *testing.T) {
	t.Parallel()
	good, _ := setup(t)
	u, err := url.Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("nobody_here", "s3cret")
	wrongRole := u.String()
	refused := "postgres://postgres:s3cret@" + deadAddr(t) + "/x?sslmode=disable"
	for _, tt := range []struct {
		name, url, want string
	}{
		{"wrong role", wrongRole, `role "nobody_here" does not exist`},
		{"refused port", refused, "connect: connection refused"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPacer(t, tt.url, nil)
			ctx := context.Background()
			err := p.Ping(ctx)
			if err == nil || !strings.Contains(err.Error(), "pacer: database unreachable") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Ping: %v, want it unreachable because %s", err, tt.want)
			}
			var connectErr *pgconn.ConnectError
			if !errors.As(err, &connectErr) {
				t.Fatalf("Ping's error %v does not wrap the *pgconn.ConnectError", err)
			}
			_, err = p.Acquire(ctx, "feeds", time.Second)
			var wait *WaitError
			if !errors.As(err, &wait) || !wait.Degraded || !errors.Is(err, ErrNoSlot) || !errors.As(err, &connectErr) {
				t.Fatalf("Acquire: %v, want a degraded *WaitError wrapping ErrNoSlot and the connection's error", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "the database is unreachable") || !strings.Contains(msg, tt.want) {
				t.Fatalf("Acquire's error says %q; want the database named as the problem, with %q", msg, tt.want)
			}
			// Latched now: Ping does not dial, and says why.
			if err := p.Ping(ctx); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Ping while latched: %v, want the outage's cause", err)
			}
			if st := p.Stats(); st.ConnectAttempts != 2 {
				t.Fatalf("%d connection attempts, want 2 (Ping, then Acquire's; none while latched)", st.ConnectAttempts)
			}
			for _, e := range []error{err, p.Ping(ctx)} {
				if strings.Contains(e.Error(), "s3cret") {
					t.Fatalf("an error shows the password: %v", e)
				}
			}
		})
	}
	// The right URL: Ping succeeds.
	if err := newPacer(t, good, nil).Ping(context.Background()); err != nil {
		t.Fatalf("Ping on the test database: %v", err)
	}
}
