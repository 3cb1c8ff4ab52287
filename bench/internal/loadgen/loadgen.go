// Package loadgen runs bench/cmd/sluice-load for the benchmark commands and reads its -json
// report.
package loadgen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
)

// Report is sluice-load's -json report (the fields the benchmarks read).
type Report struct {
	Requests int     `json:"requests"`
	RPS      float64 `json:"rps"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	Max      float64 `json:"max_ms"`
	Rate     float64 `json:"rate"` // open loop: the offered rate
	Sent     int64   `json:"sent"`
	Late     int     `json:"late"`
}

// Run runs cmd (sluice-load with -json) to its end and decodes its report; a failed run's
// error carries what it wrote.
func Run(cmd *exec.Cmd) (Report, error) {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return Report{}, fmt.Errorf("sluice-load: %v: %s%s", err, errb.String(), out.String())
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		return Report{}, fmt.Errorf("sluice-load output: %v", err)
	}
	return rep, nil
}
