// Package sourcefile reads files of sources to import — CSV with a header,
// or JSON lines — and imports them into the store (package sources), all
// or nothing. Parse needs no database (it is fuzzed: FuzzParse); Import
// parses, checks that every platform exists and writes the rows in one
// transaction (sources.AddSources).
package sourcefile

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fleetpace/fleetpace/sources"
)

// Format is the format of an import file.
type Format string

// Import formats.
const (
	FormatAuto  Format = ""      // decided from the first non-blank byte: '{' is JSON lines, else CSV
	FormatCSV   Format = "csv"   // header line naming platform, url and optionally interval and key
	FormatJSONL Format = "jsonl" // one object per line: {"platform":..., "url":..., "interval":"30m", "key":...}
)

// Options configures Parse and Import.
type Options struct {
	Format          Format        // default: FormatAuto
	DefaultInterval time.Duration // for rows without an interval; default sources.DefaultInterval
}

// Validate reports an invalid option, wrapping sources.ErrInvalid.
func (o Options) Validate() error {
	switch {
	case o.Format != FormatAuto && o.Format != FormatCSV && o.Format != FormatJSONL:
		return &sources.FieldError{Field: "format", Value: string(o.Format), Reason: "must be csv or jsonl"}
	case o.DefaultInterval != 0:
		if err := sources.ValidateInterval(o.DefaultInterval); err != nil {
			err.Reason += " (0: default)"
			return err
		}
	}
	return nil
}

// Result reports an import that was written.
type Result struct {
	Rows     int `json:"rows"`     // data rows read
	Added    int `json:"added"`    // new sources
	Existing int `json:"existing"` // rows whose platform and URL were already present (or repeated in the file)
}

// Row is one valid row of an import file.
type Row struct {
	Line int // its line number in the file, 1-based
	sources.NewSource
}

// LineError is a bad line of an import file.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

// Unwrap makes every LineError a sources.ErrInvalid.
func (e *LineError) Unwrap() error { return sources.ErrInvalid }

// maxShownLines is the most bad lines an Error's message lists (Lines
// holds them all).
const maxShownLines = 50

// Error lists every bad line of a file; nothing was written.
type Error struct {
	Lines []*LineError
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "import rejected, nothing written: %d bad line(s)", len(e.Lines))
	for i, l := range e.Lines {
		if i == maxShownLines {
			fmt.Fprintf(&b, "\n  … and %d more", len(e.Lines)-i)
			break
		}
		b.WriteString("\n  ")
		b.WriteString(l.Error())
	}
	return b.String()
}

// Unwrap makes an Error a sources.ErrInvalid.
func (e *Error) Unwrap() error { return sources.ErrInvalid }

// Import reads every row of r, validates all of them, and writes them in one
// transaction only if every row is valid: one bad line means nothing is
// written and the *Error lists every bad line with its number and reason
// (a platform that does not exist is a bad line). Rows already present
// (same platform and URL) are left unchanged (their key too), so
// re-importing a file adds nothing.
func Import(ctx context.Context, db sources.Beginner, r io.Reader, opts Options) (*Result, error) {
	rows, bad, err := parse(r, opts)
	if err != nil {
		return nil, err
	}

	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit

	// Platforms must exist: check every row against one read of the table.
	platforms, err := sources.ListPlatforms(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	known := make(map[string]bool, len(platforms))
	for _, p := range platforms {
		known[p.Name] = true
	}
	for _, row := range rows {
		if !known[row.Platform] {
			bad = append(bad, &LineError{row.Line, sources.UnknownPlatform(row.Platform)})
		}
	}
	if len(bad) > 0 {
		sortLineErrors(bad)
		return nil, &Error{Lines: bad}
	}
	if len(rows) == 0 {
		return &Result{}, nil
	}
	news := make([]sources.NewSource, len(rows))
	for i, row := range rows {
		news[i] = row.NewSource
	}
	added, err := sources.AddSources(ctx, tx, news)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("import: commit: %w", err)
	}
	return &Result{Rows: len(rows), Added: added, Existing: len(rows) - added}, nil
}

// Parse reads an import file without a database: it returns every row,
// each valid on its own (sources.NewSource.Validate: the platform's name,
// the URL, the interval, the key) with its line number, or an *Error that
// lists every bad line. Whether the platforms exist is left to Import.
// Other errors are the reader's.
//
// What it refuses, besides bad fields: in CSV, a header naming a column
// other than platform, url, interval and key (or one twice), a row with more
// fields than the header, and broken quoting (reported at the line where
// the quoted field began); in JSON lines, anything but exactly one object
// per line (two objects, trailing data), a key given twice, unknown keys
// and values that are not strings; in both, a line longer than
// MaxLineBytes and bytes that are not UTF-8. A UTF-8 byte order mark at
// the start is skipped, and blank lines are ignored.
func Parse(r io.Reader, opts Options) ([]Row, error) {
	rows, bad, err := parse(r, opts)
	if err != nil {
		return nil, err
	}
	if len(bad) > 0 {
		return nil, &Error{Lines: bad}
	}
	return rows, nil
}
