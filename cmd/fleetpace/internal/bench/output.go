package bench

import (
	"encoding/json"
	"io"
	"strconv"
	"strings"
)

// writeJSON writes v as indented JSON: the WriteJSON of every benchmark's
// result.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// metOrMissed is how the text outputs say whether a target was met.
func metOrMissed(met bool) string {
	if met {
		return "met"
	}
	return "missed"
}

// joinFloats formats xs with prec decimals, separated by spaces: the
// figures of every run on one line.
func joinFloats(xs []float64, prec int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatFloat(x, 'f', prec, 64)
	}
	return strings.Join(parts, " ")
}
