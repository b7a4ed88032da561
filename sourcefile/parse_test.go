package sourcefile_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/sourcefile"
	"github.com/fleetpace/fleetpace/sources"
)

// Parse reads import files without a database, and refuses what would
// otherwise be read wrongly or silently dropped, naming the line.
func TestParseRefuses(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", sourcefile.MaxLineBytes)
	tests := []struct {
		name    string
		in      string
		format  sourcefile.Format
		line    int
		mention string // in the line's message
	}{
		{"unterminated quote is reported where it begins", "platform,url\np,https://a.example/1\np,\"https://a.example/2\np,https://a.example/3\n", "", 3, "never closed"},
		{"extra unknown column", "platform,url,extra\np,https://a.example/1,z\n", "", 1, `"extra"`},
		{"column named twice", "platform,url,URL\np,https://a.example/1,x\n", "", 1, "twice"},
		{"empty column name", "platform,url,\np,https://a.example/1,\n", "", 1, "unknown column"},
		{"more fields than the header", "platform,url\np,https://a.example/1,1h\n", "", 2, "more than the header"},
		{"csv line over the limit", "platform,url\np,https://a.example/" + long + "\n", "", 2, "longer than"},
		{"csv invalid UTF-8 in the URL", "platform,url\np,https://a.example/\xff\n", "", 2, "UTF-8"},
		{"csv URL over the limit", "platform,url\np,https://a.example/" + strings.Repeat("b", sources.MaxURLBytes) + "\n", "", 2, "at most 2048 bytes"},
		{"csv interval below the minimum", "platform,url,interval\np,https://a.example/1,1ns\n", "", 2, "interval"},
		{"two objects on one line", `{"platform":"p","url":"https://a.example/1"}{"platform":"p","url":"https://a.example/2"}`, "", 1, "one object per line"},
		{"trailing garbage", `{"platform":"p","url":"https://a.example/1"} garbage`, "", 1, "one"},
		{"duplicate key", `{"platform":"p","url":"https://a.example/1","url":"https://a.example/2"}`, "", 1, "twice"},
		{"duplicate key in another case", `{"platform":"p","url":"https://a.example/1","URL":"https://a.example/2"}`, "", 1, "twice"},
		{"unknown key", `{"platform":"p","url":"https://a.example/1","extra":1}`, "", 1, `"extra"`},
		{"not a string", `{"platform":"p","url":7}`, "", 1, "string"},
		{"null", `{"platform":null,"url":"https://a.example/1"}`, "", 1, "string"},
		{"an array", `[{"platform":"p","url":"https://a.example/1"}]`, sourcefile.FormatJSONL, 1, "object"},
		{"json line over 1 MiB names its line", "{\"platform\":\"p\",\"url\":\"https://a.example/1\"}\n{\"platform\":\"p\",\"url\":\"https://a.example/" + long + "\"}\n", "", 2, "longer than"},
		{"json invalid UTF-8", "{\"platform\":\"p\",\"url\":\"https://a.example/\xff\"}", "", 1, "UTF-8"},
		{"json control character in the URL", `{"platform":"p","url":"https://a.example/\u0000"}`, "", 1, "control"},
		{"json unterminated", `{"platform":"p","url":"https://a.example/1"`, "", 1, "JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := sourcefile.Parse(strings.NewReader(tt.in), sourcefile.Options{Format: tt.format})
			var ie *sourcefile.Error
			if !errors.As(err, &ie) || !errors.Is(err, sources.ErrInvalid) {
				t.Fatalf("Parse = %v, %v; want an ImportError", rows, err)
			}
			if ie.Lines[0].Line != tt.line || !strings.Contains(ie.Lines[0].Error(), tt.mention) {
				t.Fatalf("first bad line: %v; want line %d mentioning %q", ie.Lines[0], tt.line, tt.mention)
			}
			if len(err.Error()) > 2000 {
				t.Fatalf("message of %d bytes: the bad value is not clipped", len(err.Error()))
			}
		})
	}
}

func TestParseAccepts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want []string // URLs
	}{
		{"BOM before a quoted header", "\ufeff\"platform\",\"url\"\np,https://a.example/1\n", []string{"https://a.example/1"}},
		{"BOM before JSON lines", "\ufeff{\"platform\":\"p\",\"url\":\"https://a.example/1\"}\n", []string{"https://a.example/1"}},
		{"header case and spaces, interval column", "Platform, URL ,Interval\np,https://a.example/1,30m\np,https://a.example/2\n", []string{"https://a.example/1", "https://a.example/2"}},
		{"blank lines", "\n{\"platform\":\"p\",\"url\":\"https://a.example/1\"}\n\n  \n{\"url\":\"https://a.example/2\",\"platform\":\"p\",\"interval\":\"2h\"}", []string{"https://a.example/1", "https://a.example/2"}},
		{"CRLF", "platform,url\r\np,https://a.example/1\r\n", []string{"https://a.example/1"}},
		{"a URL at the limit", "platform,url\np,https://a.example/" + strings.Repeat("b", sources.MaxURLBytes-len("https://a.example/")) + "\n",
			[]string{"https://a.example/" + strings.Repeat("b", sources.MaxURLBytes-len("https://a.example/"))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := sourcefile.Parse(strings.NewReader(tt.in), sourcefile.Options{})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range rows {
				got = append(got, r.URL)
				if r.Interval < time.Second {
					t.Errorf("row %+v without its default interval", r)
				}
			}
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Fatalf("rows %v, want %v", got, tt.want)
			}
		})
	}
}

// Every bad line is reported, and a line over the limit does not stop the
// JSON lines after it from being read.
func TestParseReportsEveryLine(t *testing.T) {
	t.Parallel()
	in := strings.Join([]string{
		`{"platform":"p","url":"https://a.example/1"}`,
		`{"platform":"p","url":"https://a.example/` + strings.Repeat("x", sourcefile.MaxLineBytes) + `"}`,
		`{"platform":"p","url":"https://a.example/3"}{}`,
		`{"platform":"p","url":"ftp://a.example/4"}`,
		`{"platform":"p","url":"https://a.example/5"}`,
	}, "\n")
	_, err := sourcefile.Parse(strings.NewReader(in), sourcefile.Options{})
	var ie *sourcefile.Error
	if !errors.As(err, &ie) || len(ie.Lines) != 3 || ie.Lines[0].Line != 2 || ie.Lines[1].Line != 3 || ie.Lines[2].Line != 4 {
		t.Fatalf("Parse = %v; want lines 2, 3 and 4", err)
	}
}
