package sources

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Format is the format of an import file.
type Format string

// Import formats.
const (
	FormatAuto  Format = ""      // decided from the first non-blank byte: '{' is JSON lines, else CSV
	FormatCSV   Format = "csv"   // header line naming platform, url and optionally interval
	FormatJSONL Format = "jsonl" // one object per line: {"platform":..., "url":..., "interval":"30m"}
)

// ImportOptions configures Import.
type ImportOptions struct {
	Format          Format        // default: FormatAuto
	DefaultInterval time.Duration // for rows without an interval; default DefaultInterval
}

// Validate reports an invalid option, wrapping ErrInvalid.
func (o ImportOptions) Validate() error {
	switch {
	case o.Format != FormatAuto && o.Format != FormatCSV && o.Format != FormatJSONL:
		return &FieldError{Field: "format", Value: string(o.Format), Reason: "must be csv or jsonl"}
	case o.DefaultInterval < 0:
		return &FieldError{Field: "interval", Value: o.DefaultInterval.String(), Reason: "must be > 0 (0: default)"}
	}
	return nil
}

// ImportResult reports an import that was written.
type ImportResult struct {
	Rows     int `json:"rows"`     // data rows read
	Added    int `json:"added"`    // new sources
	Existing int `json:"existing"` // rows whose platform and URL were already present (or repeated in the file)
}

type importRow struct {
	line int
	NewSource
}

// Import reads every row of r, validates all of them, and writes them in one
// transaction only if every row is valid: one bad line means nothing is
// written and the ImportError lists every bad line with its number and
// reason. Rows already present (same platform and URL) are left unchanged, so
// re-importing a file adds nothing.
func Import(ctx context.Context, db Beginner, r io.Reader, opts ImportOptions) (*ImportResult, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	if opts.DefaultInterval == 0 {
		opts.DefaultInterval = DefaultInterval
	}
	br := bufio.NewReaderSize(r, 64*1024)
	format := opts.Format
	if format == FormatAuto {
		format = sniff(br)
	}
	var (
		rows    []importRow
		badRows []*LineError
		err     error
	)
	if format == FormatJSONL {
		rows, badRows, err = readJSONL(br, opts.DefaultInterval)
	} else {
		rows, badRows, err = readCSV(br, opts.DefaultInterval)
	}
	if err != nil {
		return nil, err
	}

	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit

	// Platforms must exist: check every row against one read of the table.
	known := map[string]bool{}
	nameRows, err := tx.Query(ctx, platformNamesSQL)
	if err != nil {
		return nil, fmt.Errorf("import: platforms: %w", err)
	}
	names, err := pgx.CollectRows(nameRows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("import: platforms: %w", err)
	}
	for _, n := range names {
		known[n] = true
	}
	for _, row := range rows {
		if !known[row.Platform] {
			badRows = append(badRows, &LineError{row.line, unknownPlatform(row.Platform)})
		}
	}
	if len(badRows) > 0 {
		sortLineErrors(badRows)
		return nil, &ImportError{Lines: badRows}
	}
	if len(rows) == 0 {
		return &ImportResult{}, nil
	}

	if _, err := tx.Exec(ctx, importTempTableSQL); err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	_, err = tx.CopyFrom(ctx, pgx.Identifier{"fleetpace_import"}, []string{"platform", "url", "check_interval"},
		pgx.CopyFromSlice(len(rows), func(i int) ([]any, error) {
			return []any{rows[i].Platform, rows[i].URL, rows[i].Interval}, nil
		}))
	if err != nil {
		return nil, fmt.Errorf("import: copy: %w", err)
	}
	tag, err := tx.Exec(ctx, importInsertSQL)
	if err != nil {
		return nil, fmt.Errorf("import: insert: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("import: commit: %w", err)
	}
	added := int(tag.RowsAffected())
	return &ImportResult{Rows: len(rows), Added: added, Existing: len(rows) - added}, nil
}

func sniff(br *bufio.Reader) Format {
	for i := 1; ; i++ {
		b, err := br.Peek(i)
		if err != nil || len(b) < i {
			return FormatCSV
		}
		switch c := b[i-1]; c {
		case ' ', '\t', '\r', '\n', 0xEF, 0xBB, 0xBF: // blanks and a UTF-8 BOM
			continue
		case '{':
			return FormatJSONL
		default:
			return FormatCSV
		}
	}
}

func readCSV(r io.Reader, defInterval time.Duration) ([]importRow, []*LineError, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, []*LineError{{1, &FieldError{Field: "header", Value: "", Reason: "cannot be read: " + err.Error()}}}, nil
	}
	col := map[string]int{}
	for i, h := range header {
		col[strings.ToLower(strings.TrimSpace(strings.TrimPrefix(h, "\ufeff")))] = i
	}
	for _, need := range []string{"platform", "url"} {
		if _, ok := col[need]; !ok {
			return nil, []*LineError{{1, &FieldError{Field: "header", Value: strings.Join(header, ","), Reason: "must name the columns platform and url (and optionally interval)"}}}, nil
		}
	}
	get := func(rec []string, name string) string {
		i, ok := col[name]
		if !ok || i >= len(rec) {
			return ""
		}
		return strings.TrimSpace(rec[i])
	}
	var rows []importRow
	var bad []*LineError
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		line, _ := cr.FieldPos(0)
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				bad = append(bad, &LineError{pe.Line, &FieldError{Field: "csv", Value: "", Reason: pe.Err.Error()}})
				continue
			}
			return nil, nil, fmt.Errorf("import: read: %w", err)
		}
		if len(rec) == 1 && strings.TrimSpace(rec[0]) == "" {
			continue
		}
		row, lerr := parseRow(line, get(rec, "platform"), get(rec, "url"), get(rec, "interval"), defInterval)
		if lerr != nil {
			bad = append(bad, lerr)
			continue
		}
		rows = append(rows, row)
	}
	return rows, bad, nil
}

func readJSONL(r io.Reader, defInterval time.Duration) ([]importRow, []*LineError, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	var rows []importRow
	var bad []*LineError
	line := 0
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if line == 1 {
			text = bytes.TrimPrefix(text, []byte("\ufeff"))
		}
		if len(text) == 0 {
			continue
		}
		var obj struct {
			Platform string          `json:"platform"`
			URL      string          `json:"url"`
			Interval json.RawMessage `json:"interval"`
		}
		dec := json.NewDecoder(bytes.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&obj); err != nil {
			bad = append(bad, &LineError{line, &FieldError{Field: "json", Value: truncate(string(text), 60), Reason: "is not a valid object: " + err.Error()}})
			continue
		}
		interval := ""
		if len(obj.Interval) > 0 {
			if err := json.Unmarshal(obj.Interval, &interval); err != nil {
				bad = append(bad, &LineError{line, &FieldError{Field: "interval", Value: string(obj.Interval), Reason: `must be a duration string such as "30m"`}})
				continue
			}
		}
		row, lerr := parseRow(line, obj.Platform, obj.URL, interval, defInterval)
		if lerr != nil {
			bad = append(bad, lerr)
			continue
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("import: read line %d: %w", line+1, err)
	}
	return rows, bad, nil
}

func parseRow(line int, platform, rawURL, interval string, def time.Duration) (importRow, *LineError) {
	s := NewSource{Platform: platform, URL: rawURL, Interval: def}
	if interval != "" {
		d, err := time.ParseDuration(interval)
		if err != nil {
			return importRow{}, &LineError{line, &FieldError{Field: "interval", Value: interval, Reason: `must be a duration such as "30m" or "1h"`}}
		}
		s.Interval = d
	}
	if err := s.Validate(); err != nil {
		return importRow{}, &LineError{line, err}
	}
	return importRow{line: line, NewSource: s}, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func sortLineErrors(errs []*LineError) {
	slices.SortStableFunc(errs, func(a, b *LineError) int { return cmp.Compare(a.Line, b.Line) })
}
