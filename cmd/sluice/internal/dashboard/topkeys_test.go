package dashboard

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/sluice-proxy/sluice/host"
)

// A rule's top keys come from the snapshot's summaries of that rule only, in a fixed order
// (denied then consumed, current then last), at most TopKeysShown keys each; a rule without
// summaries has none, and they follow the snapshot from one scrape to the next.
func TestTopKeysInState(t *testing.T) {
	ranks := func(prefix string, n int) []host.TopKeyRank {
		var out []host.TopKeyRank
		for i := 0; i < n; i++ {
			out = append(out, host.TopKeyRank{Key: fmt.Sprintf("%s-%d", prefix, i), Count: uint64(100 - i), Err: 1})
		}
		return out
	}
	s1 := snapshot(configJSON, 10, counters(5, 5, 0))
	s1.TopKeys = []host.TopKeys{
		{Plugin: "sluice", Rule: "per-client", Kind: "consumed", Since: at(0), Total: 900, ErrorBound: 14, Keys: ranks("c", 3)},
		{Plugin: "sluice", Rule: "per-client", Kind: "denied", Last: true, Since: at(-60), Total: 40, ErrorBound: 0, Keys: ranks("old", 2)},
		{Plugin: "sluice", Rule: "per-client", Kind: "denied", Since: at(0), Total: 2000, ErrorBound: 31, Keys: ranks("abuser", 20)},
		{Plugin: "sluice", Rule: "other", Kind: "denied", Since: at(0), Total: 1, Keys: ranks("x", 1)},
	}
	s2 := snapshot(configJSON, 20, counters(5, 6, 0))
	s2.TopKeys = []host.TopKeys{{Plugin: "sluice", Rule: "per-client", Kind: "denied", Since: at(1), Total: 1, Keys: []host.TopKeyRank{}}}
	d := New(source(s1, s2), Options{})
	scrapeAll(t, d, 0)

	r := rule(t, d.State(at(0.5)), "per-client")
	var got []string
	for _, tk := range r.TopKeys {
		got = append(got, fmt.Sprintf("%s/%s total %d bound %d keys %d", tk.Kind, tk.Period, tk.Total, tk.ErrorBound, len(tk.Keys)))
	}
	want := []string{"denied/current total 2000 bound 31 keys 10", "denied/last total 40 bound 0 keys 2", "consumed/current total 900 bound 14 keys 3"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("top keys\n %v\nwant\n %v", got, want)
	}
	if k := r.TopKeys[0].Keys; k[0] != (host.TopKeyRank{Key: "abuser-0", Count: 100, Err: 1}) || k[9].Key != "abuser-9" {
		t.Errorf("denied keys %v", k)
	}
	if !r.TopKeys[1].Since.Equal(at(-60)) {
		t.Errorf("last period since %v", r.TopKeys[1].Since)
	}
	if a := rule(t, d.State(at(0.5)), "audit"); a.TopKeys != nil {
		t.Errorf("audit has top keys %+v", a.TopKeys)
	}

	scrapeAll(t, d, 1)
	r = rule(t, d.State(at(1.5)), "per-client")
	if len(r.TopKeys) != 1 || r.TopKeys[0].Total != 1 || r.TopKeys[0].Keys == nil || len(r.TopKeys[0].Keys) != 0 {
		t.Errorf("after the next scrape: %+v", r.TopKeys)
	}
}
