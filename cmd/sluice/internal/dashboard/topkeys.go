package dashboard

import (
	"time"

	"github.com/sluice-proxy/sluice/host"
)

// Top keys (the configuration's "top_keys"): the host's snapshot carries the summaries the
// filter keeps in shared data (host.TopKeys: per rule, the keys it denied and the keys that
// consumed it, over the current period and the last one). A rule's are shown with it, as
// the snapshot has them when the page asks: they change once a second, when the workers
// merge what they counted.

// TopKeysShown is how many keys of each summary a rule shows, largest first.
const TopKeysShown = 10

// topKeysOrder is the order of a rule's summaries: kind, then period.
var topKeysOrder = []struct {
	kind string
	last bool
}{{"denied", false}, {"denied", true}, {"consumed", false}, {"consumed", true}}

// TopKeys is one summary of a rule: the keys it denied (Kind "denied", counting requests)
// or that consumed it ("consumed", counting cost units) over the period that began at
// Since ("current", still filling, or "last", the finished one). Every key that counted
// more than ErrorBound in the period is among the summary's keys, and each count exceeds
// the key's true count by at most its Err (≤ ErrorBound).
type TopKeys struct {
	Kind       string            `json:"kind"`
	Period     string            `json:"period"`
	Since      time.Time         `json:"since"`
	Total      uint64            `json:"total"`
	ErrorBound uint64            `json:"error_bound"`
	Keys       []host.TopKeyRank `json:"keys"`
}

// topKeysOf returns the summaries of the rule named name, in topKeysOrder (nil: none; the
// rule has no top keys, or nothing was counted yet).
func topKeysOf(all []host.TopKeys, name string) []TopKeys {
	var out []TopKeys
	for _, o := range topKeysOrder {
		for _, t := range all {
			if t.Rule != name || t.Kind != o.kind || t.Last != o.last {
				continue
			}
			tk := TopKeys{Kind: t.Kind, Period: "current", Since: t.Since.UTC(), Total: t.Total, ErrorBound: t.ErrorBound, Keys: t.Keys}
			if t.Last {
				tk.Period = "last"
			}
			if len(tk.Keys) > TopKeysShown {
				tk.Keys = tk.Keys[:TopKeysShown]
			}
			if tk.Keys == nil {
				tk.Keys = []host.TopKeyRank{}
			}
			out = append(out, tk)
			break
		}
	}
	return out
}
