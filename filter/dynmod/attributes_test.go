package dynmod

import "testing"

// TestDecisionAsDynamicMetadata: a refusal sets the decision as fields of the dynamic
// metadata namespace "sluice", and names its rule in response.rule_header.
func TestDecisionAsDynamicMetadata(t *testing.T) {
	e := newFakeEnvoy(1)
	_, c := newTestConfig(t, e, `{"rules":[{"name":"per-key","key":[{"header":"x-key"}],"algorithm":"fixed_window","limit":1,"window":"1m"}],
	  "access_log":{"key":"raw"},"response":{"rule_header":"x-sluice-rule"}}`)
	req(t, e, c, 0, "x-key", "a")
	r := req(t, e, c, 0, "x-key", "a")
	if r.status != 429 || r.headers["x-sluice-rule"] != "per-key" {
		t.Fatalf("refusal: %d %v", r.status, r.headers)
	}
	md := e.streams[r.f].metadata
	if md["sluice.rule"] != "per-key" || md["sluice.decision"] != "denied" || md["sluice.key"] != "a" || md["sluice.remaining"] != "0" {
		t.Fatalf("metadata %v", md)
	}
}
