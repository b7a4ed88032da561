package sourcefile_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fleetpace/fleetpace/sourcefile"
	"github.com/fleetpace/fleetpace/sources"
)

// FuzzParse: whatever the file, Parse does not panic; it returns valid
// rows with increasing line numbers, or an *Error whose lines exist in the
// input; and it says the same thing twice. Seeds: testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add("platform,url,interval\np,https://a.example/1,30m\n", uint8(0))
	f.Add("{\"platform\":\"p\",\"url\":\"https://a.example/1\"}\n", uint8(2))
	f.Fuzz(func(t *testing.T, in string, format uint8) {
		opts := sourcefile.Options{Format: []sourcefile.Format{sourcefile.FormatAuto, sourcefile.FormatCSV, sourcefile.FormatJSONL}[format%3]}
		rows, err := sourcefile.Parse(strings.NewReader(in), opts)
		lines := strings.Count(in, "\n") + 1
		var ie *sourcefile.Error
		switch {
		case err == nil:
			last := 0
			for _, r := range rows {
				if r.Line <= last || r.Line > lines {
					t.Fatalf("row on line %d after line %d (%d lines)", r.Line, last, lines)
				}
				last = r.Line
				if verr := r.NewSource.Validate(); verr != nil {
					t.Fatalf("line %d: an invalid row was returned: %v", r.Line, verr)
				}
			}
		case errors.As(err, &ie):
			if len(ie.Lines) == 0 || !errors.Is(err, sources.ErrInvalid) {
				t.Fatalf("Error without lines: %v", err)
			}
			for _, l := range ie.Lines {
				if l.Line < 1 || l.Line > lines {
					t.Fatalf("bad line %d of a %d-line input", l.Line, lines)
				}
			}
			if !utf8.ValidString(err.Error()) && utf8.ValidString(in) {
				t.Fatalf("message is not UTF-8: %q", err.Error())
			}
		default:
			t.Fatalf("Parse of an in-memory input failed without an *Error: %v", err)
		}
		rows2, err2 := sourcefile.Parse(strings.NewReader(in), opts)
		if !reflect.DeepEqual(rows, rows2) || (err == nil) != (err2 == nil) || (err != nil && err.Error() != err2.Error()) {
			t.Fatalf("two parses differ: %v %v / %v %v", rows, err, rows2, err2)
		}
	})
}
