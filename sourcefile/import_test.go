package sourcefile_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/sourcefile"
	"github.com/fleetpace/fleetpace/sources"
)

// An import is all or nothing: every bad line is reported with its number
// (a platform that does not exist too) and nothing is written; importing
// the same file again adds nothing.
func TestImport(t *testing.T) {
	t.Parallel()
	ctx, pool := context.Background(), testdb.Pool(t)
	storetest.Platform(t, pool, sources.Platform{Name: "p", RatePerSec: 1})
	var b strings.Builder
	b.WriteString("platform,url,interval\n")
	for i := 1; i <= 1000; i++ {
		if i == 537 {
			b.WriteString("p,notaurl,1h\n")
			continue
		}
		fmt.Fprintf(&b, "p,https://p.example/%d,30m\n", i)
	}
	_, err := sourcefile.Import(ctx, pool, strings.NewReader(b.String()), sourcefile.Options{})
	var ie *sourcefile.Error
	if !errors.As(err, &ie) || len(ie.Lines) != 1 || ie.Lines[0].Line != 538 || !errors.Is(err, sources.ErrInvalid) {
		t.Fatalf("import error = %v, want exactly line 538 (header is line 1)", err)
	}
	if !strings.Contains(err.Error(), "line 538") {
		t.Fatalf("message does not name the line: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM fleetpace_source`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows written after a rejected import: %d %v", n, err)
	}

	// Every bad line is reported, not just the first.
	_, err = sourcefile.Import(ctx, pool, strings.NewReader(
		`{"platform":"p","url":"https://p.example/a"}
{"platform":"nope","url":"https://p.example/b"}

{"platform":"p","url":"https://p.example/c","interval":"soon"}
{not json}
`), sourcefile.Options{})
	if !errors.As(err, &ie) || len(ie.Lines) != 3 || ie.Lines[0].Line != 2 || ie.Lines[1].Line != 4 || ie.Lines[2].Line != 5 {
		t.Fatalf("jsonl errors = %v, want lines 2, 4, 5", err)
	}

	good := strings.ReplaceAll(b.String(), "p,notaurl,1h", "p,https://p.example/537,1h")
	res, err := sourcefile.Import(ctx, pool, strings.NewReader(good), sourcefile.Options{})
	if err != nil || res.Added != 1000 {
		t.Fatalf("good import: %+v %v", res, err)
	}
	res, err = sourcefile.Import(ctx, pool, strings.NewReader(good), sourcefile.Options{})
	if err != nil || res.Added != 0 || res.Existing != 1000 {
		t.Fatalf("re-import: %+v %v, want nothing added", res, err)
	}
}
