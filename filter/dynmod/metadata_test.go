package dynmod

import (
	"strings"
	"testing"
)

// A key part and a match condition from dynamic metadata through the ABI's getters: a
// top-level key is read (string or number); a nested path, which the ABI cannot read, is
// refused with the configuration.
func TestMetadataThroughABI(t *testing.T) {
	e := newFakeEnvoy(2)
	if _, err := newModule(e).newConfig(nil, "sluice", []byte(`{"rules":[{"name":"nested","key":[{"metadata":{"namespace":"auth","path":"payload.sub"}}],
	  "algorithm":"fixed_window","limit":1,"window":"1h"}]}`)); err == nil || !strings.Contains(strings.Join(e.logs, "\n"), "nested field") {
		t.Fatalf("a nested path: %v %q", err, e.logs)
	}
	_, c := newTestConfig(t, e, `{"rules":[
	  {"name":"sub","match":{"metadata":[{"namespace":"auth","path":"plan","exact":"free"}]},
	   "key":[{"metadata":{"namespace":"auth","path":"sub"}}],"missing_key":"deny","algorithm":"fixed_window","limit":2,"window":"1h"}]}`)
	e.meta = map[string]any{"auth/plan": "free", "auth/sub": "alice"}
	for i := 0; i < 2; i++ {
		if r := req(t, e, c, i%2, "x-sub", "forged"); r.status != 200 {
			t.Fatalf("alice %d: %d", i, r.status)
		}
	}
	if r := req(t, e, c, 0); r.status != 429 {
		t.Fatalf("alice 3: %d, want 429", r.status)
	}
	e.meta["auth/sub"] = 7.0
	if r := req(t, e, c, 1); r.status != 200 {
		t.Fatalf("sub 7: %d", r.status)
	}
	e.meta["auth/plan"] = 1.0 // not "free": the rule does not apply
	e.meta["auth/sub"] = "alice"
	if r := req(t, e, c, 1); r.status != 200 {
		t.Fatalf("alice on another plan: %d", r.status)
	}
	e.meta = map[string]any{"auth/plan": "free"}
	if r := req(t, e, c, 0); r.status != 429 {
		t.Fatalf("no sub: %d, want 429 (deny)", r.status)
	}
}
