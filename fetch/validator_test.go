package fetch

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestSanitizeValidator(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want string
	}{
		{"", ""},
		{`"abc"`, `"abc"`},
		{`W/"0815"`, `W/"0815"`},
		{"Mon, 02 Jan 2006 15:04:05 GMT", "Mon, 02 Jan 2006 15:04:05 GMT"},
		{`"héllo wörld ✓"`, `"héllo wörld ✓"`}, // valid UTF-8 passes unchanged
		{`"` + strings.Repeat("a", MaxValidatorLen-2) + `"`, `"` + strings.Repeat("a", MaxValidatorLen-2) + `"`},
		{`"` + strings.Repeat("a", MaxValidatorLen-1) + `"`, ""}, // one byte over
		{strings.Repeat("x", 1<<20), ""},
		{"\"\xff\xfe\"", ""},     // invalid UTF-8 (the repro)
		{"\"\xc3\"", ""},         // truncated sequence
		{"\"\xed\xa0\x80\"", ""}, // UTF-16 surrogate encoded in UTF-8
		{"\"a\x00b\"", ""},       // NUL
		{"\"a\tb\"", ""},         // HTAB
		{"\"a\x1bb\"", ""},       // ESC
		{"\"a\x7fb\"", ""},       // DEL
		{"\"a\u0085b\"", ""},     // C1 control (NEL)
		{"\"a\r\nX: y\"", ""},    // header injection attempt
	}
	for _, tt := range tests {
		if got := SanitizeValidator(tt.in); got != tt.want {
			t.Errorf("SanitizeValidator(%.40q) = %.40q, want %.40q", tt.in, got, tt.want)
		}
	}
}

// FuzzSanitizeValidator: the result is always "" or the input unchanged; it
// is valid UTF-8, free of control characters and within MaxValidatorLen; an
// input that already is all that comes back unchanged.
func FuzzSanitizeValidator(f *testing.F) {
	for _, s := range []string{`"abc"`, `W/"x"`, "Mon, 02 Jan 2006 15:04:05 GMT", "\"\xff\xfe\"", "a\x00", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out := SanitizeValidator(in)
		if out != "" && out != in {
			t.Fatalf("SanitizeValidator(%q) = %q: neither the input nor dropped", in, out)
		}
		if !utf8.ValidString(out) || len(out) > MaxValidatorLen || strings.ContainsFunc(out, unicode.IsControl) {
			t.Fatalf("SanitizeValidator(%q) = %q: not a fit validator", in, out)
		}
		fine := utf8.ValidString(in) && len(in) <= MaxValidatorLen && !strings.ContainsFunc(in, unicode.IsControl)
		if fine && out != in {
			t.Fatalf("SanitizeValidator(%q) = %q, want the fine input unchanged", in, out)
		}
	})
}
