//go:build !unix

package integration

import "time"

// processCPU is not available here; the benchmark then reports 0.
func processCPU() time.Duration { return 0 }
