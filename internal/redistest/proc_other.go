//go:build !linux

package redistest

import "os/exec"

// dieWithParent is Linux-only; elsewhere Close must run to stop the servers.
func dieWithParent(cmd *exec.Cmd) {}
