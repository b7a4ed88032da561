// Package atomicfile writes a file whole or not at all: the charts of the
// demo and of the herd simulations, which a reader may open at any time.
package atomicfile

import (
	"io"
	"os"
)

// Write writes w to a temporary file beside path and renames it to path:
// path holds either its old content or all of the new.
func Write(path string, w io.WriterTo) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := w.WriteTo(f); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
