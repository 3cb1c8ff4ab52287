// Command sluice-startup measures how fast `sluice run` answers its first request without a
// compilation cache, and how much memory it holds once idle (package bench/startup):
//
//	sluice-startup [-sluice dist/sluice[,other/sluice...]] [-wasm dist/sluice.wasm[,other.wasm...]] [-workers 2] [-rounds 3] [-idle 2s] [-floor sluice-floor]
//
// Every binary is measured with every module, in turn within each round (interleaved), so
// that a busy machine slows them alike and their ratios hold. The last lines are the medians
// of the rounds, and the ratios of each configuration's CPU and VmRSS to the first's. With
// -floor (a built bench/cmd/sluice-floor), the minimal wazero host runs every module in the
// same rounds, and each configuration is also compared with the floor for its module.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/bench/startup"
)

func main() {
	bins := flag.String("sluice", "dist/sluice", "the sluice binary; several, comma-separated")
	wasms := flag.String("wasm", "dist/sluice.wasm", "the module `sluice run` loads; several, comma-separated")
	workers := flag.Int("workers", 2, "--workers for sluice run")
	rounds := flag.Int("rounds", 3, "rounds; the summary is their median")
	idle := flag.Duration("idle", 2*time.Second, "idle time after the first answer before RSS is read")
	floor := flag.String("floor", "", "an bench/cmd/sluice-floor binary: also measure the minimal wazero host with every module, in the same rounds")
	flag.Parse()
	var configs []startup.Config
	for _, b := range strings.Split(*bins, ",") {
		for _, w := range strings.Split(*wasms, ",") {
			configs = append(configs, startup.Config{Sluice: b, Wasm: w})
		}
	}
	nRun := len(configs)
	if *floor != "" {
		for _, w := range strings.Split(*wasms, ",") {
			configs = append(configs, startup.Config{Sluice: *floor, Wasm: w, Floor: true})
		}
	}
	sums, err := startup.Measure(configs, startup.Options{Workers: *workers, Rounds: *rounds, Idle: *idle,
		Progress: func(r int, c startup.Config, s startup.Sample) {
			fmt.Printf("%s round %d: first response %v (CPU %v), idle %s\n", c, r, s.First.Round(time.Millisecond), s.CPU, s.Mem)
		}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-startup:", err)
		os.Exit(1)
	}
	for _, s := range sums {
		fmt.Printf("%s: median of %d: %s, %d workers, no compilation cache\n", s.Config, *rounds, s, *workers)
	}
	if nRun > 1 {
		base := sums[0]
		for _, s := range sums[1:nRun] {
			fmt.Printf("%s vs %s: CPU until the first response %.2fx, idle VmRSS %.2fx (medians)\n", s.Config, base.Config,
				float64(s.CPU)/float64(base.CPU), float64(s.RSSKB)/float64(base.RSSKB))
		}
	}
	for _, f := range sums[nRun:] {
		for _, s := range sums[:nRun] {
			if s.Config.Wasm == f.Config.Wasm {
				fmt.Printf("%s vs the floor: CPU %.2fx (%+.2f s), idle VmRSS %.2fx (%+.1f MB: file %+.1f, anon %+.1f)\n", s.Config,
					float64(s.CPU)/float64(f.CPU), (s.CPU - f.CPU).Seconds(), float64(s.RSSKB)/float64(f.RSSKB), startup.MB(s.RSSKB-f.RSSKB),
					startup.MB(s.Mem.File-f.Mem.File), startup.MB(s.Mem.Anon-f.Mem.Anon))
			}
		}
	}
}
