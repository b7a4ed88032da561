package sourcefile

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fleetpace/fleetpace/sources"
)

// MaxLineBytes is the longest line of an import file: far more than a row
// needs (a URL is at most sources.MaxURLBytes), and a bound on what one
// line costs.
const MaxLineBytes = 1 << 20

func parse(r io.Reader, opts Options) ([]Row, []*LineError, error) {
	if err := opts.Validate(); err != nil {
		return nil, nil, fmt.Errorf("import: %w", err)
	}
	if opts.DefaultInterval == 0 {
		opts.DefaultInterval = sources.DefaultInterval
	}
	br := bufio.NewReaderSize(r, 64*1024)
	if b, err := br.Peek(len(bom)); err == nil && string(b) == bom {
		_, _ = br.Discard(len(bom))
	}
	format := opts.Format
	if format == FormatAuto {
		format = sniff(br)
	}
	var (
		rows []Row
		bad  []*LineError
		err  error
	)
	if format == FormatJSONL {
		rows, bad, err = readJSONL(br, opts.DefaultInterval)
	} else {
		rows, bad, err = readCSV(br, opts.DefaultInterval)
	}
	sortLineErrors(bad)
	return rows, bad, err
}

// bom is the UTF-8 byte order mark.
const bom = "\ufeff"

func sniff(br *bufio.Reader) Format {
	for i := 1; ; i++ {
		b, err := br.Peek(i)
		if err != nil || len(b) < i {
			return FormatCSV
		}
		switch c := b[i-1]; c {
		case ' ', '\t', '\r', '\n':
			continue
		case '{':
			return FormatJSONL
		default:
			return FormatCSV
		}
	}
}

// csvColumns are the columns an import's CSV header may name.
var csvColumns = []string{"platform", "url", "interval", "key"}

func readCSV(r io.Reader, defInterval time.Duration) ([]Row, []*LineError, error) {
	lr := &lineLimiter{r: r, max: MaxLineBytes, line: 1}
	cr := csv.NewReader(lr)
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	cr.ReuseRecord = true
	// csvError turns a read error into a bad line, or returns it as the
	// reader's error.
	csvError := func(err error) (*LineError, error) {
		var tooLong *lineTooLongError
		var pe *csv.ParseError
		switch {
		case errors.As(err, &tooLong):
			return &LineError{tooLong.line, &sources.FieldError{Field: "line", Value: "", Reason: fmt.Sprintf("is longer than %d bytes", MaxLineBytes)}}, nil
		case errors.As(err, &pe):
			line, reason := pe.StartLine, pe.Err.Error()
			if line == 0 {
				line = pe.Line
			}
			if errors.Is(pe.Err, csv.ErrQuote) && pe.Line > line {
				reason = fmt.Sprintf("has a quoted field that is never closed (read to line %d)", pe.Line)
			}
			return &LineError{line, &sources.FieldError{Field: "csv", Value: "", Reason: reason}}, nil
		}
		return nil, fmt.Errorf("import: read: %w", err)
	}
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, nil, nil
	}
	if err != nil {
		le, err := csvError(err)
		if le != nil {
			le.Err = &sources.FieldError{Field: "header", Value: "", Reason: "cannot be read: " + le.Err.Error()}
			return nil, []*LineError{le}, nil
		}
		return nil, nil, err
	}
	headerLine, _ := cr.FieldPos(0)
	col := map[string]int{}
	for i, h := range header {
		name := strings.ToLower(strings.TrimSpace(h))
		if !slices.Contains(csvColumns, name) {
			return nil, []*LineError{{headerLine, &sources.FieldError{Field: "header", Value: h,
				Reason: fmt.Sprintf("names an unknown column (column %d; the columns are %s)", i+1, strings.Join(csvColumns, ", "))}}}, nil
		}
		if _, dup := col[name]; dup {
			return nil, []*LineError{{headerLine, &sources.FieldError{Field: "header", Value: h, Reason: fmt.Sprintf("names column %s twice", name)}}}, nil
		}
		col[name] = i
	}
	for _, need := range []string{"platform", "url"} {
		if _, ok := col[need]; !ok {
			return nil, []*LineError{{headerLine, &sources.FieldError{Field: "header", Value: strings.Join(header, ","),
				Reason: "must name the columns platform and url (and optionally interval and key)"}}}, nil
		}
	}
	get := func(rec []string, name string) string {
		i, ok := col[name]
		if !ok || i >= len(rec) {
			return ""
		}
		return strings.TrimSpace(rec[i])
	}
	var rows []Row
	var bad []*LineError
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			le, err := csvError(err)
			if err != nil {
				return nil, nil, err
			}
			bad = append(bad, le)
			if lr.failed {
				break // the rest of an over-long line cannot be read as CSV
			}
			continue
		}
		line, _ := cr.FieldPos(0)
		if len(rec) == 1 && strings.TrimSpace(rec[0]) == "" {
			continue
		}
		if len(rec) > len(header) {
			bad = append(bad, &LineError{line, &sources.FieldError{Field: "csv", Value: strings.Join(rec[len(header):], ","),
				Reason: fmt.Sprintf("has %d fields, more than the header's %d", len(rec), len(header))}})
			continue
		}
		row, lerr := parseRow(line, get(rec, "platform"), get(rec, "url"), get(rec, "interval"), get(rec, "key"), defInterval)
		if lerr != nil {
			bad = append(bad, lerr)
			continue
		}
		rows = append(rows, row)
	}
	return rows, bad, nil
}

// lineLimiter passes r through and fails once a line grows longer than max
// bytes (line counts lines, for the error).
type lineLimiter struct {
	r      io.Reader
	max    int
	line   int  // the line being read
	n      int  // its bytes so far
	failed bool // a line was too long; nothing more is read
}

type lineTooLongError struct{ line int }

func (e *lineTooLongError) Error() string { return fmt.Sprintf("line %d is too long", e.line) }

func (l *lineLimiter) Read(p []byte) (int, error) {
	if l.failed {
		return 0, &lineTooLongError{l.line}
	}
	n, err := l.r.Read(p)
	for i, c := range p[:n] {
		if c == '\n' {
			l.line++
			l.n = 0
			continue
		}
		if l.n++; l.n > l.max {
			l.failed = true
			return i, &lineTooLongError{l.line}
		}
	}
	return n, err
}

// jsonKeys are the keys of an import's JSON object.
var jsonKeys = []string{"platform", "url", "interval", "key"}

func readJSONL(br *bufio.Reader, defInterval time.Duration) ([]Row, []*LineError, error) {
	var rows []Row
	var bad []*LineError
	for line := 1; ; line++ {
		text, tooLong, err := readLine(br, MaxLineBytes)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, nil, fmt.Errorf("import: read line %d: %w", line, err)
		}
		switch {
		case tooLong:
			bad = append(bad, &LineError{line, &sources.FieldError{Field: "line", Value: "", Reason: fmt.Sprintf("is longer than %d bytes", MaxLineBytes)}})
		case len(bytes.TrimSpace(text)) > 0:
			fields, lerr := parseJSONLine(line, bytes.TrimSpace(text))
			if lerr != nil {
				bad = append(bad, lerr)
				break
			}
			row, lerr := parseRow(line, fields["platform"], fields["url"], fields["interval"], fields["key"], defInterval)
			if lerr != nil {
				bad = append(bad, lerr)
				break
			}
			rows = append(rows, row)
		}
		if errors.Is(err, io.EOF) {
			return rows, bad, nil
		}
	}
}

// readLine reads one line (without its newline) of at most max bytes; a
// longer one is read to its end, dropped and reported as tooLong. err is
// io.EOF at the end of the input (with the last line, if it had no newline).
func readLine(br *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	n := 0
	for {
		chunk, err := br.ReadSlice('\n')
		n += len(chunk)
		if n <= max+1 { // +1: the newline
			line = append(line, chunk...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if bytes.HasSuffix(chunk, []byte("\n")) {
			n--
			line = line[:len(line)-1]
		}
		if n > max {
			return nil, true, err
		}
		return line, false, err
	}
}

// parseJSONLine reads one line holding exactly one JSON object whose keys
// are among jsonKeys (in any letter case, each at most once) and whose
// values are strings.
func parseJSONLine(line int, text []byte) (map[string]string, *LineError) {
	bad := func(field, value, reason string) *LineError {
		return &LineError{line, &sources.FieldError{Field: field, Value: value, Reason: reason}}
	}
	if !utf8.Valid(text) {
		return nil, bad("json", "", "is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(text))
	syntax := func(err error) *LineError {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return bad("json", "", "is not one valid JSON object: "+err.Error())
	}
	if tok, err := dec.Token(); err != nil {
		return nil, syntax(err)
	} else if tok != json.Delim('{') {
		return nil, bad("json", "", "must be one JSON object per line")
	}
	fields := map[string]string{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, syntax(err)
		}
		key, _ := tok.(string)
		name := strings.ToLower(key)
		if !slices.Contains(jsonKeys, name) {
			return nil, bad("json", key, fmt.Sprintf("has an unknown key (the keys are %s)", strings.Join(jsonKeys, ", ")))
		}
		if _, dup := fields[name]; dup {
			return nil, bad(name, key, "is given twice")
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, syntax(err)
		}
		var v string
		if err := json.Unmarshal(raw, &v); err != nil || raw[0] != '"' {
			return nil, bad(name, clip(string(raw), 40), "must be a JSON string")
		}
		fields[name] = v
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, syntax(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, bad("json", "", fmt.Sprintf("has more after the object (at byte %d): one object per line", dec.InputOffset()+1))
	}
	return fields, nil
}

func parseRow(line int, platform, rawURL, interval, key string, def time.Duration) (Row, *LineError) {
	s := sources.NewSource{Platform: platform, URL: rawURL, Interval: def, Key: key}
	if interval != "" {
		d, err := time.ParseDuration(interval)
		if err != nil {
			return Row{}, &LineError{line, &sources.FieldError{Field: "interval", Value: interval, Reason: `must be a duration such as "30m" or "1h"`}}
		}
		s.Interval = d
	}
	if err := s.Validate(); err != nil {
		return Row{}, &LineError{line, err}
	}
	return Row{Line: line, NewSource: s}, nil
}

func sortLineErrors(errs []*LineError) {
	slices.SortStableFunc(errs, func(a, b *LineError) int { return cmp.Compare(a.Line, b.Line) })
}

// clip shortens valid UTF-8 s to at most n bytes, cut at a character
// boundary, marking the cut with "…".
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
