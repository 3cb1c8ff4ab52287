package filter

// Counting by response (config.Count, a rule's "count"): the request reserved its cost at
// its headers like any cost; its response headers decide the settlement: the reservation
// stands when the status and header conditions hold, else it is refunded in full. A stream
// without response headers settles by no_usage, which count leaves at "reservation": it
// stays charged.

import "github.com/sluice-proxy/sluice/filter/abi"

// billCount settles a counting rule's item from the response headers.
func (p *Plugin) billCount(it *billItem) {
	c := it.r.cost.resp.Count
	status := -1
	if v, st := p.host.GetHeader(abi.MapResponseHeaders, ":status"); st == abi.StatusOK {
		if n, ok := wholeNumber(v, 999); ok {
			status = int(n)
		}
	}
	match := c.MatchesStatus(status)
	if match && c.Header != "" {
		v, st := p.host.GetHeader(abi.MapResponseHeaders, c.Header)
		match = c.MatchesHeader(v, st == abi.StatusOK)
	}
	it.found = true
	it.actual = 0
	if match {
		it.actual = it.reserved
	}
}
