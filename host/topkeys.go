package host

import (
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/internal/topk"
)

// TopKeys is one top-keys summary the filter keeps in shared data (its "top_keys"): the
// heaviest keys of a rule denied or consumed over a period. The host reads it as the
// filter's encoding (internal/topk) under topk.SharedPrefix; it knows nothing of rules.
type TopKeys struct {
	Plugin string `json:"plugin"`
	Rule   string `json:"rule"`
	Kind   string `json:"kind"` // "denied" or "consumed"
	// Last is the finished period (false: the current one, still filling).
	Last  bool      `json:"last"`
	Since time.Time `json:"since"`
	Total uint64    `json:"total"`
	// ErrorBound is the most any count exceeds the key's true weight (Total / counters).
	ErrorBound uint64       `json:"error_bound"`
	Keys       []TopKeyRank `json:"keys"`
}

// TopKeyRank is one key of a summary, largest count first: Count overestimates its true
// weight by at most Err.
type TopKeyRank struct {
	Key   string `json:"key"`
	Count uint64 `json:"count"`
	Err   uint64 `json:"err"`
}

// topKeysShown is how many keys of each summary the admin shows.
const topKeysShown = 20

// topKeysOf decodes every summary in d (one that does not decode is left out).
func topKeysOf(d *SharedData) []TopKeys {
	out := []TopKeys{}
	for _, k := range d.Keys() {
		rest, ok := strings.CutPrefix(k, topk.SharedPrefix)
		if !ok {
			continue
		}
		v, _, ok := d.Get(k)
		if !ok {
			continue
		}
		dec, err := topk.Decode(v)
		if err != nil {
			continue
		}
		t := TopKeys{Since: time.Unix(0, dec.Since).UTC(), Total: dec.Total}
		rest, t.Last = strings.CutSuffix(rest, ":last")
		if i := strings.LastIndexByte(rest, ':'); i >= 0 {
			rest, t.Kind = rest[:i], rest[i+1:]
		}
		if i := strings.LastIndexByte(rest, ':'); i >= 0 {
			t.Plugin, t.Rule = rest[:i], rest[i+1:]
		}
		s := topk.New(len(dec.Entries) + 1)
		for _, e := range dec.Entries {
			x, _ := s.Add(e.ID, e.Count)
			x.Err = e.Err
			x.SetShown(e.Shown())
		}
		t.ErrorBound = dec.ErrorBound()
		t.Keys = []TopKeyRank{}
		for _, e := range s.Top(topKeysShown) {
			t.Keys = append(t.Keys, TopKeyRank{Key: string(e.Shown()), Count: e.Count, Err: e.Err})
		}
		out = append(out, t)
	}
	return out
}
