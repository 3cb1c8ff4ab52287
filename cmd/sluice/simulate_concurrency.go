package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/cmd/sluice/internal/sim"
)

// runConcurrency runs a concurrency rule (its limiter's limit; the rule's delay as its
// queue) through sim.RunConcurrency, with sim.Run's signature.
func runConcurrency(tr *sim.Traffic, name string, lim algorithms.Limiter, opt sim.Options) (*sim.Result, error) {
	return sim.RunConcurrency(tr, name, lim.Params().Limit, opt)
}

// printInFlight prints, for each concurrency rule, its peak in flight and its queue.
func printInFlight(w io.Writer, results []*sim.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := false
	for _, r := range results {
		f := r.InFlight
		if f == nil {
			continue
		}
		if !header {
			fmt.Fprintln(w)
			fmt.Fprintln(tw, "rule\tmost in flight at once\tkey\tqueue\tqueued\trefused at the delay\tlongest wait")
			header = true
		}
		queue, queued, expired, wait := "none", "-", "-", "-"
		if f.Delay > 0 {
			queue = "delay<=" + fmtWindow(f.Delay)
			queued, expired, wait = fmt.Sprint(f.Queued), fmt.Sprint(f.Expired), fmtWindow(f.WaitMax.Round(time.Microsecond))
		}
		fmt.Fprintf(tw, "%s\t%d\t%q\t%s\t%s\t%s\t%s\n", r.Name, f.Peak, f.PeakKey, queue, queued, expired, wait)
		if !f.Durations {
			fmt.Fprintf(tw, "%s\t(the traffic gives no durations: every request ends at once; a CSV's fifth column says how long each holds its slot)\n", r.Name)
		}
	}
	tw.Flush()
}
