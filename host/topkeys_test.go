package host

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/internal/topk"
)

// TestTopKeysInStatus: the filter's summaries in shared data appear in /status by plugin,
// rule and kind, largest first, with the error bound; other keys and garbage do not.
func TestTopKeysInStatus(t *testing.T) {
	d := newSharedData()
	s := topk.New(4)
	for _, k := range []string{"a", "b", "b", "c", "c", "c"} {
		e, fresh := s.Add(uint64(k[0]), 1)
		if fresh {
			e.SetShown([]byte(k))
		}
	}
	d.Set(topk.SharedPrefix+"p:api:denied", s.Append(nil, 5e9), 0)
	d.Set(topk.SharedPrefix+"p:api:denied:last", s.Append(nil, 1e9), 0)
	d.Set(topk.SharedPrefix+"p:api:consumed", []byte("garbage"), 0)
	d.Set("sluice:seed", []byte("x"), 0)
	got := Snapshot{TopKeys: topKeysOf(d)}.Status().TopKeys
	if len(got) != 2 {
		t.Fatalf("%d summaries: %+v", len(got), got)
	}
	cur := got[0]
	if cur.Plugin != "p" || cur.Rule != "api" || cur.Kind != "denied" || cur.Last || cur.Total != 6 || cur.ErrorBound != 0 ||
		len(cur.Keys) != 3 || cur.Keys[0].Key != "c" || cur.Keys[0].Count != 3 || cur.Since.UnixNano() != 5e9 {
		t.Fatalf("current: %+v", cur)
	}
	if !got[1].Last {
		t.Fatalf("last: %+v", got[1])
	}
	b, _ := json.Marshal(Snapshot{TopKeys: got}.Status())
	if !strings.Contains(string(b), `"top_keys":[{"plugin":"p","rule":"api","kind":"denied","last":false`) {
		t.Fatalf("status JSON: %s", b)
	}
}
