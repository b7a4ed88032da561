package pgembed

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
)

// initFromCache fills the data directory with a copy of the initialized
// one kept in Config.InitCache for these binaries, making it first if no
// start made it yet. Concurrent first starts each initialize a directory
// of their own and rename it into place; the first rename wins.
func (c *Cluster) initFromCache(ctx context.Context) error {
	key, err := c.initKey()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.cfg.InitCache, 0o755); err != nil {
		return fmt.Errorf("pgembed: Config.InitCache: %w", err)
	}
	kept := filepath.Join(c.cfg.InitCache, key)
	if _, err := os.Stat(filepath.Join(kept, "PG_VERSION")); err != nil {
		tmp, err := os.MkdirTemp(c.cfg.InitCache, key+".tmp-")
		if err != nil {
			return fmt.Errorf("pgembed: Config.InitCache: %w", err)
		}
		defer os.RemoveAll(tmp)
		if err := os.Chmod(tmp, 0o700); err != nil {
			return fmt.Errorf("pgembed: %w", err)
		}
		if err := c.chown(tmp); err != nil {
			return err
		}
		if err := c.initdb(ctx, tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, kept); err != nil && !errors.Is(err, syscall.EEXIST) && !errors.Is(err, syscall.ENOTEMPTY) {
			return fmt.Errorf("pgembed: Config.InitCache: %w", err)
		}
	}
	// cp -a as the server's user keeps every file's mode and owner.
	cmd := exec.CommandContext(ctx, "cp", "-a", kept+"/.", c.dataDir)
	cmd.SysProcAttr = c.command(ctx, "postgres").SysProcAttr
	if c.cred != nil {
		cmd.Dir = "/"
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgembed: copy the initialized data directory from %s: %w\n%s", kept, err, out)
	}
	return nil
}

// initKey names the initialized data directory of these binaries and
// initdb options: a new PostgreSQL package, or other options, makes a new
// one.
func (c *Cluster) initKey() (string, error) {
	fi, err := os.Stat(filepath.Join(c.binDir, "initdb"))
	if err != nil {
		return "", fmt.Errorf("pgembed: %w", err)
	}
	h := sha256.New()
	for _, part := range append([]string{c.binDir, strconv.FormatInt(fi.Size(), 10), fi.ModTime().UTC().String()}, initdbArgs...) {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return "initdb-" + hex.EncodeToString(h.Sum(nil))[:16], nil
}
