package rlqs

import (
	"testing"

	"github.com/sluice-proxy/sluice/serve/rls"
)

const matchConfig = `
domain: m
descriptors:
  - key: tier
    value: gold
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tier
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: path
    value: /web/*
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// A bucket matches as the descriptor of its entries sorted by key: the
// same key_value / wildcard / key rules, the limit of the node the last
// entry reaches, and share_threshold's shared counter (one pool for every
// value the wildcard matches), while a plain wildcard keeps one per value.
func TestBucketMatchesAsDescriptor(t *testing.T) {
	cfg, err := rls.ParseConfig([]string{"m.yaml"}, [][]byte{[]byte(matchConfig)})
	if err != nil {
		t.Fatal(err)
	}
	match := func(id map[string]string) *rls.Matched {
		_, es := canonical(id)
		return cfg.Match("m", es)
	}
	for _, c := range []struct {
		id    map[string]string
		limit uint32 // 0: no limit
	}{
		{map[string]string{"user": "u", "tier": "gold"}, 100}, // sorted: tier, user
		{map[string]string{"user": "u", "tier": "free"}, 10},
		{map[string]string{"tier": "gold"}, 0}, // the walk ends on a node without a limit
		{map[string]string{"path": "/api/x"}, 50},
		{map[string]string{"path": "/web/x"}, 5},
		{map[string]string{"path": "/other"}, 0},
		{map[string]string{"zone": "z", "user": "u"}, 0}, // sorted: user first, not configured at the top
	} {
		m := match(c.id)
		switch {
		case c.limit == 0 && m != nil:
			t.Errorf("%v matched %s", c.id, m.FullKey)
		case c.limit != 0 && (m == nil || m.Limit.RequestsPerUnit != c.limit):
			t.Errorf("%v: got %+v, want the limit %d", c.id, m, c.limit)
		}
	}
	a, b := match(map[string]string{"path": "/api/x"}), match(map[string]string{"path": "/api/y"})
	if a.KeyPart != b.KeyPart || Key("m", a.KeyPart) != Key("m", b.KeyPart) {
		t.Errorf("share_threshold: %q and %q do not share a pool", a.KeyPart, b.KeyPart)
	}
	a, b = match(map[string]string{"path": "/web/x"}), match(map[string]string{"path": "/web/y"})
	if a.KeyPart == b.KeyPart {
		t.Errorf("a plain wildcard shares one pool across values: %q", a.KeyPart)
	}
	if m := cfg.Match("other", []rls.Entry{{Key: "path", Value: "/api/x"}}); m != nil {
		t.Errorf("an unknown domain matched %s", m.FullKey)
	}
}
