package dashboard

import "github.com/sluice-proxy/sluice/filter"

// MetricHelp is the # HELP text of the filter's metrics, for host.Options.MetricHelp:
// filter.MetricHelp, whose table sits next to the filter's metric names. "sluice rule
// per-client: requests allowed" for sluice.per-client.allowed, a description of the
// filter's other metrics, and "" for a name the filter does not define.
func MetricHelp(name string) string { return filter.MetricHelp(name) }
