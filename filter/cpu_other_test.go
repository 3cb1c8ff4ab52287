//go:build !unix

package filter_test

import "time"

// processCPU is not available here; the benchmark then reports 0.
func processCPU() time.Duration { return 0 }
