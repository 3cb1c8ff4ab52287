package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
)

// The key flood through the filter's own key table, every
// algorithm at 10 per minute: max_keys 1000, 20,000 one-request attacker
// keys, 100 innocents × 5, 5 heavy hitters × 100. No innocent is denied,
// no heavy hitter gets more than limit × 1.2, the table stays within
// max_keys entries and evicts.
func TestFloodThroughKeyTable(t *testing.T) {
	p := DefaultPattern(Flood, 10, time.Minute)
	tr := mustGenerate(t, p)
	if len(tr.Keys) != 20_105 || len(tr.Requests) != 20_000+500+500 {
		t.Fatalf("%d keys, %d requests", len(tr.Keys), len(tr.Requests))
	}
	for i := 1; i < len(tr.Requests); i++ {
		if tr.Requests[i].At < tr.Requests[i-1].At || tr.Requests[i].At >= tr.End {
			t.Fatalf("request %d out of order or span", i)
		}
	}
	for _, k := range algorithms.Kinds {
		t.Run(k.String(), func(t *testing.T) {
			res, err := Run(tr, k.String(), mustLimiter(t, k, 10, time.Minute), Options{MaxKeys: 1000})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Classes) != 3 {
				t.Fatalf("classes %+v", res.Classes)
			}
			att, inn, heavy := res.Classes[0], res.Classes[1], res.Classes[2]
			if att.Name != "attacker" || att.Keys != 20_000 || inn.Keys != 100 || inn.Offered != 500 || heavy.Keys != 5 || heavy.Offered != 500 {
				t.Fatalf("classes %+v", res.Classes)
			}
			if inn.Denied != 0 {
				t.Errorf("%d of %d innocent requests denied", inn.Denied, inn.Offered)
			}
			if heavy.MaxPerKey > 12 || heavy.MaxPerKey < 10 {
				t.Errorf("a heavy hitter admitted %d, limit 10", heavy.MaxPerKey)
			}
			if res.Entries > 1000 || res.Entries < 900 || res.Evicted == 0 || res.EvictedUsed < res.Evicted-int64(res.Entries) {
				t.Errorf("entries %d, evicted %d (used %d)", res.Entries, res.Evicted, res.EvictedUsed)
			}
			if res.EntryBytes < res.Entries*(len("sluice::")+len(k.String())+2+slotHeaderBytes) {
				t.Errorf("%d bytes for %d entries", res.EntryBytes, res.Entries)
			}
			t.Logf("innocent denied %d/%d, heavy max %d, entries %d (%d bytes), evicted %d (used %d)",
				inn.Denied, inn.Offered, heavy.MaxPerKey, res.Entries, res.EntryBytes, res.Evicted, res.EvictedUsed)
		})
	}
	// Without a table (MaxKeys 0) every key keeps its state: the same
	// innocents and heavy hitters, no eviction, no entries.
	res, err := Run(tr, "x", mustLimiter(t, algorithms.FixedWindow, 10, time.Minute), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Classes[1].Denied != 0 || res.Classes[2].MaxPerKey != 10 || res.Evicted != 0 || res.Entries != 0 {
		t.Errorf("without a table: %+v, evicted %d, entries %d", res.Classes, res.Evicted, res.Entries)
	}
}

// slotHeaderBytes is the filter's slot header (version + identity).
const slotHeaderBytes = 9

func TestFloodPatternErrors(t *testing.T) {
	base := DefaultPattern(Flood, 10, time.Minute)
	for _, tc := range []struct {
		mod  func(*Pattern)
		want string
	}{
		{func(p *Pattern) { p.Duration = 0 }, "duration 0s must be positive"},
		{func(p *Pattern) { p.Attackers = -1 }, "-1 keys"},
		{func(p *Pattern) { p.Attackers = MaxKeys }, "keys; the simulator holds at most"},
		{func(p *Pattern) { p.AttackerRequests = MaxRequests }, "would offer"},
		{func(p *Pattern) { p.AttackerRequests, p.InnocentRequests, p.HeavyRequests = 0, 0, 0 }, "offers no request"},
	} {
		p := base
		tc.mod(&p)
		_, err := Generate(p)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %v, want it to contain %q", err, tc.want)
		}
	}
	if _, err := Run(mustGenerate(t, base), "x", mustLimiter(t, algorithms.FixedWindow, 1, time.Second), Options{MaxKeys: -1}); err == nil {
		t.Error("MaxKeys -1 accepted")
	}
}
