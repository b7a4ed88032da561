package pgembed

// WatchdogPID is the pid of c's watchdog process (0: none), for the tests.
func WatchdogPID(c *Cluster) int {
	if c.watchdog == nil {
		return 0
	}
	return c.watchdog.cmd.Process.Pid
}
