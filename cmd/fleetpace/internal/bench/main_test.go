package bench

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"

	"github.com/fleetpace/fleetpace/internal/testdb"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }

// result is what a benchmark returns: it writes itself as text and as JSON.
type result interface {
	WriteText(w io.Writer) error
	WriteJSON(w io.Writer) error
}

// written writes res as text and as JSON and decodes the JSON into v: the
// outputs a test checks. A write or the decoding failing fails the test.
func written(t *testing.T, res result, v any) (text, js string) {
	t.Helper()
	var tb, jb bytes.Buffer
	if err := res.WriteText(&tb); err != nil {
		t.Fatalf("text: %v\n%s", err, tb.String())
	}
	if err := res.WriteJSON(&jb); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(jb.Bytes(), v); err != nil {
		t.Fatalf("json: %v\n%s", err, jb.String())
	}
	return tb.String(), jb.String()
}
