// Package configtest generates plugin configurations for tests: valid ones
// that use every field, each documented bound at its boundary and one step
// past it, and hostile mutations of the valid ones (control characters,
// newlines, quotes, backslashes, non-printing runes and invalid UTF-8 in
// field names and values, raw or JSON-escaped). The config tests, `sluice
// check`'s tests and the test that compares `sluice check` with the compiled
// module all draw from it, so they judge the same corpus.
//
// It imports nothing of sluice: it produces bytes, and what they mean is for
// the tests to decide.
package configtest

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// Case is one generated configuration.
type Case struct {
	Name string
	JSON []byte
}

// rule returns a rule object from a valid fixed_window rule with fields
// replaced (raw JSON values; "" removes the field) or added, in order.
func rule(kv ...string) string {
	fields := [][2]string{
		{"name", `"r"`},
		{"key", `[{"remote_ip":true}]`},
		{"algorithm", `"fixed_window"`},
		{"limit", `10`},
		{"window", `"1s"`},
	}
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for j := range fields {
			if fields[j][0] == kv[i] {
				fields[j][1], found = kv[i+1], true
			}
		}
		if !found {
			fields = append(fields, [2]string{kv[i], kv[i+1]})
		}
	}
	var parts []string
	for _, f := range fields {
		if f[1] != "" {
			parts = append(parts, strconv.Quote(f[0])+":"+f[1])
		}
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// doc returns a configuration of the rules plus extra top-level members.
func doc(top string, rules ...string) string {
	s := `{"rules":[` + strings.Join(rules, ",") + `]`
	if top != "" {
		s += "," + top
	}
	return s + "}"
}

const redisObj = `"redis":{"cluster":"outbound|6379||redis.default.svc.cluster.local","timeout_ms":50,"instances":3}`

// Valid returns configurations that both builds load (local backend only)
// and configurations that only sluice-redis.wasm loads (names ending in
// "/redis"); together they use every field of the contract.
func Valid() []Case {
	cs := []Case{
		{"design-example", []byte(`{
  "rules": [{
    "name": "api-per-key",
    "match": {"path_prefix": "/api/", "methods": ["GET", "POST"],
              "headers": [{"name": "x-tenant", "exact": "acme"}]},
    "key": [{"header": "x-api-key"}],
    "algorithm": "token_bucket",
    "limit": 100, "window": "1m", "burst": 20,
    "backend": "local",
    "mode": "enforce"
  }],
  "response": {"status": 429, "body": "rate limited\n", "headers": "both"},
  "failure_mode": "open",
  "client_ip": {"xff_trusted_hops": 0},
  "redis": {"cluster": "outbound|6379||redis.default.svc.cluster.local", "timeout_ms": 50}
}`)},
		{"every-algorithm", []byte(doc(`"response":{"status":503,"body":"","headers":"legacy"},"failure_mode":"closed","client_ip":{"xff_trusted_hops":2}`,
			rule("name", `"tb"`, "algorithm", `"token_bucket"`, "burst", "3", "key", `[{"remote_ip":true,"ipv6_prefix":64},{"query":"k"}]`),
			rule("name", `"lb"`, "algorithm", `"leaky_bucket"`, "limit", "5", "window", `"1m30s"`, "key", `[{"cookie":"session"}]`, "mode", `"shadow"`),
			rule("name", `"fw"`, "key", `[{"path":true},{"method":true}]`, "match", `{"path_prefix":"/a","methods":["get","DELETE"]}`, "max_keys", "7"),
			rule("name", `"sl"`, "algorithm", `"sliding_log"`, "limit", "100", "window", `"1d12h"`, "key", `[{"header":":authority"}]`),
			rule("name", `"sw"`, "algorithm", `"sliding_window"`, "window", `"500ms"`, "match", `{"headers":[{"name":"X-A","exact":"é \" \\ \u2028"}]}`),
		))},
		{"minimal", []byte(doc("", rule()))},
		{"keyless", []byte(doc("",
			rule("name", `"shared"`, "key", `[{"header":"x-api-key"},{"remote_ip":true}]`, "missing_key", `"shared"`),
			rule("name", `"deny"`, "key", `[{"query":"api_key"}]`, "missing_key", `"deny"`, "mode", `"shadow"`),
			rule("name", `"absent"`, "match", `{"headers":[{"name":"x-api-key","absent":true},{"name":"x-b","exact":""}]}`, "missing_key", `"skip"`),
		))},
		{"spaced", []byte("\n\t{ \"rules\" : [ " + rule("name", `"Spaced.Name_1-2"`) + " ] }\r\n")},
		{"redis/design", []byte(doc(`"failure_mode":"local",`+redisObj,
			rule("name", `"api"`, "algorithm", `"token_bucket"`, "limit", "100", "window", `"1m"`, "burst", "20", "backend", `"redis"`),
			rule("name", `"local"`, "algorithm", `"sliding_log"`, "limit", "5", "window", `"15m"`),
			rule("name", `"tenant"`, "algorithm", `"sliding_window"`, "limit", "10000", "window", `"1h"`, "backend", `"redis"`, "key", `[{"header":"x-tenant"},{"method":true}]`),
		))},
		{"redis/every-algorithm", []byte(doc(`"failure_mode":"open","redis":{"cluster":"rc","timeout_ms":1,"instances":10000,"username":"u","password":"p\n"}`,
			rule("name", `"tb"`, "algorithm", `"token_bucket"`, "backend", `"redis"`),
			rule("name", `"lb"`, "algorithm", `"leaky_bucket"`, "backend", `"redis"`, "burst", "1"),
			rule("name", `"fw"`, "backend", `"redis"`),
			rule("name", `"sl"`, "algorithm", `"sliding_log"`, "backend", `"redis"`, "limit", "10000"),
			rule("name", `"sw"`, "algorithm", `"sliding_window"`, "backend", `"redis"`),
		))},
	}
	return cs
}

// Boundaries returns, for every numeric and size bound of the contract
// (README's configuration reference, the Redis scripts' bounds and the
// local fallback's), a configuration at the bound and one just past it;
// and a Redis rule for each build. Names say which side: "/ok" is within
// the bound, "/over" past it (for sluice-redis.wasm where the bound is the
// Redis backend's).
func Boundaries() []Case {
	var cs []Case
	add := func(name, ok, over string) {
		cs = append(cs, Case{name + "/ok", []byte(ok)}, Case{name + "/over", []byte(over)})
	}
	r := func(kv ...string) string { return doc("", rule(kv...)) }
	rr := func(top string, kv ...string) string {
		return doc(top, rule(append([]string{"backend", `"redis"`}, kv...)...))
	}
	add("limit-low", r("limit", "1"), r("limit", "0"))
	add("limit-high", r("limit", "1000000000"), r("limit", "1000000001"))
	add("sliding-log-limit", r("algorithm", `"sliding_log"`, "limit", "10000"), r("algorithm", `"sliding_log"`, "limit", "10001"))
	add("window-low", r("window", `"1ms"`), r("window", `"0ms"`))
	add("window-high", r("window", `"366d"`), r("window", `"366d1ms"`))
	add("burst-low", r("algorithm", `"token_bucket"`, "burst", "1"), r("algorithm", `"token_bucket"`, "burst", "0"))
	add("burst-high", r("algorithm", `"leaky_bucket"`, "limit", "1000000000", "burst", "1000000000"), r("algorithm", `"leaky_bucket"`, "limit", "1000000000", "burst", "1000000001"))
	// Burst × window / limit at most 100 × 366 days.
	add("fill-time", r("algorithm", `"token_bucket"`, "limit", "1", "window", `"366d"`, "burst", "100"), r("algorithm", `"token_bucket"`, "limit", "1", "window", `"366d"`, "burst", "101"))
	add("max-keys-low", r("max_keys", "1"), r("max_keys", "0"))
	add("max-keys-high", r("max_keys", "1000000"), r("max_keys", "1000001"))
	add("key-parts", r("key", "["+strings.Repeat(`{"path":true},`, 7)+`{"path":true}]`), r("key", "["+strings.Repeat(`{"path":true},`, 8)+`{"path":true}]`))
	add("name-length", r("name", `"`+strings.Repeat("n", 64)+`"`), r("name", `"`+strings.Repeat("n", 65)+`"`))
	add("header-length", r("key", `[{"header":"`+strings.Repeat("h", 256)+`"}]`), r("key", `[{"header":"`+strings.Repeat("h", 257)+`"}]`))
	add("query-length", r("key", `[{"query":"`+strings.Repeat("q", 256)+`"}]`), r("key", `[{"query":"`+strings.Repeat("q", 257)+`"}]`))
	add("cookie-length", r("key", `[{"cookie":"`+strings.Repeat("c", 256)+`"}]`), r("key", `[{"cookie":"`+strings.Repeat("c", 257)+`"}]`))
	add("ipv6-prefix-low", r("key", `[{"remote_ip":true,"ipv6_prefix":1}]`), r("key", `[{"remote_ip":true,"ipv6_prefix":0}]`))
	add("ipv6-prefix-high", r("key", `[{"remote_ip":true,"ipv6_prefix":128}]`), r("key", `[{"remote_ip":true,"ipv6_prefix":129}]`))
	add("status-low", doc(`"response":{"status":200}`, rule()), doc(`"response":{"status":199}`, rule()))
	add("status-high", doc(`"response":{"status":599}`, rule()), doc(`"response":{"status":600}`, rule()))
	add("body-length", doc(`"response":{"body":"`+strings.Repeat("b", 65536)+`"}`, rule()), doc(`"response":{"body":"`+strings.Repeat("b", 65537)+`"}`, rule()))
	add("xff-hops", doc(`"client_ip":{"xff_trusted_hops":64}`, rule()), doc(`"client_ip":{"xff_trusted_hops":65}`, rule()))
	add("redis-timeout-low", doc(`"redis":{"cluster":"c","timeout_ms":1}`, rule()), doc(`"redis":{"cluster":"c","timeout_ms":0}`, rule()))
	add("redis-timeout-high", doc(`"redis":{"cluster":"c","timeout_ms":60000}`, rule()), doc(`"redis":{"cluster":"c","timeout_ms":60001}`, rule()))
	add("redis-instances", doc(`"redis":{"cluster":"c","instances":10000}`, rule()), doc(`"redis":{"cluster":"c","instances":10001}`, rule()))
	// The document's size, at most 1 MiB (the padding is in the body).
	pad := func(size int) string {
		base := doc(`"response":{"body":""}`, rule())
		return doc(`"response":{"body":"`+strings.Repeat(" ", size-len(base))+`"}`, rule())
	}
	add("document-size", pad(1<<20), pad(1<<20+1))
	// sluice-redis.wasm: limit or burst × window in µs below 2^53 − 10^9
	// (104249 per day), and the local fallback (limit 3, burst B, 2
	// instances: limit 1, burst B/2) refilling within 100 × 366 days.
	add("redis/scaled-token-bucket", rr(redisObj, "algorithm", `"token_bucket"`, "limit", "104249", "window", `"1d"`), rr(redisObj, "algorithm", `"token_bucket"`, "limit", "104250", "window", `"1d"`))
	add("redis/scaled-burst", rr(redisObj, "algorithm", `"leaky_bucket"`, "limit", "10", "burst", "104249", "window", `"1d"`), rr(redisObj, "algorithm", `"leaky_bucket"`, "limit", "10", "burst", "104250", "window", `"1d"`))
	add("redis/scaled-sliding-window", rr(redisObj, "algorithm", `"sliding_window"`, "limit", "104249", "window", `"1d"`), rr(redisObj, "algorithm", `"sliding_window"`, "limit", "104250", "window", `"1d"`))
	fb := `"redis":{"cluster":"c","instances":2}`
	add("redis/fallback-fill-time", rr(fb, "algorithm", `"token_bucket"`, "limit", "3", "burst", "73201", "window", `"1d"`), rr(fb, "algorithm", `"token_bucket"`, "limit", "3", "burst", "73202", "window", `"1d"`))
	add("redis/needs-redis-object", rr(redisObj), rr(""))
	add("redis/failure-mode-local", doc(`"failure_mode":"local",`+redisObj, rule("backend", `"redis"`)), doc(`"failure_mode":"local",`+redisObj, rule()))
	return cs
}

// Hostile returns the strings the mutations insert: every C0 control
// character, DEL, C1 controls and non-printing runes in UTF-8, quotes,
// backslashes, a forged error line, invalid UTF-8, an empty and a long
// string.
func Hostile() []string {
	h := []string{
		"\n", "\r\n", "\t", "\x00", "\x1b[31m", "\x1b]0;title\x07", "\x7f", "\x08\x08\x08",
		"\u0085", "\u009b2J", "\u00a0", "\u200b", "\u2028", "\u2029", "\u202e", "\ufeff", "\U000e0001",
		`"`, `\`, `\n`, `"}`, "'", "[", "]", ".", ": ",
		"ok\nrules[0].limit: 0 is out of range 1..1000000000",
		"\nok\n", "limit\n", "x\ny",
		"\xff", "\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80",
		"", " ", strings.Repeat("a", 300), strings.Repeat("\n", 100),
	}
	for c := 1; c < 0x20; c++ {
		h = append(h, string(rune(c)))
	}
	return h
}

// knownNames are field names of the contract, combined with hostile text
// so that a mutation looks like a typo of a real field.
var knownNames = []string{"rules", "name", "limit", "window", "key", "header", "match", "headers", "exact", "response", "redis", "cluster", "path_prefix", "methods", "burst"}

// Mutations returns n configurations derived from Valid() by one to three
// random edits each — an inserted or renamed member, an edited or replaced
// value — whose text holds Hostile() strings, written raw (invalid JSON
// for control characters, invalid UTF-8 as is) or JSON-escaped. seed makes
// the sequence reproducible.
func Mutations(seed uint64, n int) []Case {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	valid := Valid()
	trees := make([]*node, len(valid))
	for i, c := range valid {
		trees[i] = parse(gjson.ParseBytes(c.JSON))
	}
	hostile := Hostile()
	out := make([]Case, 0, n)
	for i := 0; i < n; i++ {
		k := rng.IntN(len(trees))
		t := trees[k].clone()
		var what []string
		for e := 1 + rng.IntN(3); e > 0; e-- {
			what = append(what, mutate(rng, t, hostile))
		}
		raw := rng.IntN(4) == 0 // one in four writes control characters raw
		out = append(out, Case{
			Name: valid[k].Name + "/" + strconv.Itoa(i) + ":" + strings.Join(what, ","),
			JSON: t.appendJSON(nil, raw),
		})
	}
	return out
}

// node is a JSON value that keeps member order and duplicates.
type node struct {
	kind  byte // 'o' object, 'a' array, 's' string, 'r' raw literal
	keys  []string
	elems []*node
	str   string // 's': the decoded string; 'r': the literal
}

func parse(v gjson.Result) *node {
	switch {
	case v.IsObject():
		n := &node{kind: 'o'}
		v.ForEach(func(k, x gjson.Result) bool {
			n.keys = append(n.keys, k.String())
			n.elems = append(n.elems, parse(x))
			return true
		})
		return n
	case v.IsArray():
		n := &node{kind: 'a'}
		for _, x := range v.Array() {
			n.elems = append(n.elems, parse(x))
		}
		return n
	case v.Type == gjson.String:
		return &node{kind: 's', str: v.Str}
	}
	return &node{kind: 'r', str: v.Raw}
}

func (n *node) clone() *node {
	c := &node{kind: n.kind, str: n.str, keys: append([]string(nil), n.keys...)}
	for _, e := range n.elems {
		c.elems = append(c.elems, e.clone())
	}
	return c
}

// all lists n and every node inside it.
func (n *node) all(out []*node) []*node {
	out = append(out, n)
	for _, e := range n.elems {
		out = e.all(out)
	}
	return out
}

func pick[T any](rng *rand.Rand, s []T) T { return s[rng.IntN(len(s))] }

// hostileText is a hostile string, alone or spliced into a known name.
func hostileText(rng *rand.Rand, hostile []string) string {
	h := pick(rng, hostile)
	switch rng.IntN(4) {
	case 0:
		return pick(rng, knownNames) + h
	case 1:
		return h + pick(rng, knownNames)
	case 2:
		k := pick(rng, knownNames)
		i := rng.IntN(len(k) + 1)
		return k[:i] + h + k[i:]
	}
	return h
}

// mutate applies one random edit to the tree and says which.
func mutate(rng *rand.Rand, t *node, hostile []string) string {
	nodes := t.all(nil)
	var objects, strs []*node
	for _, x := range nodes {
		switch x.kind {
		case 'o':
			objects = append(objects, x)
		case 's':
			strs = append(strs, x)
		}
	}
	switch rng.IntN(5) {
	case 0, 1: // insert a member with a hostile name
		o := pick(rng, objects)
		i := rng.IntN(len(o.keys) + 1)
		v := pick(rng, []*node{{kind: 'r', str: "1"}, {kind: 's', str: pick(rng, hostile)}, {kind: 'o'}, {kind: 'r', str: "true"}})
		o.keys = append(o.keys[:i], append([]string{hostileText(rng, hostile)}, o.keys[i:]...)...)
		o.elems = append(o.elems[:i], append([]*node{v}, o.elems[i:]...)...)
		return "insert-member"
	case 2: // rename a member
		o := pick(rng, objects)
		if len(o.keys) == 0 {
			o.keys, o.elems = append(o.keys, hostileText(rng, hostile)), append(o.elems, &node{kind: 'r', str: "null"})
			return "insert-member"
		}
		i := rng.IntN(len(o.keys))
		k := o.keys[i]
		j := rng.IntN(len(k) + 1)
		o.keys[i] = k[:j] + pick(rng, hostile) + k[j:]
		return "rename-member"
	case 3: // edit a string value
		if len(strs) == 0 {
			return "none"
		}
		s := pick(rng, strs)
		j := rng.IntN(len(s.str) + 1)
		s.str = s.str[:j] + pick(rng, hostile) + s.str[j:]
		return "edit-string"
	}
	// Replace a member's value by a hostile string or a hostile object.
	o := pick(rng, objects)
	if len(o.elems) == 0 {
		return "none"
	}
	i := rng.IntN(len(o.elems))
	if rng.IntN(2) == 0 {
		o.elems[i] = &node{kind: 's', str: hostileText(rng, hostile)}
	} else {
		o.elems[i] = &node{kind: 'o', keys: []string{hostileText(rng, hostile)}, elems: []*node{{kind: 's', str: pick(rng, hostile)}}}
	}
	return "replace-value"
}

// appendJSON writes n. Strings are written with their bytes as they are
// (invalid UTF-8 stays invalid) except '"' and '\\', and, unless raw,
// control characters, which are escaped (\n, or \u00XX).
func (n *node) appendJSON(b []byte, raw bool) []byte {
	switch n.kind {
	case 'o':
		b = append(b, '{')
		for i, k := range n.keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k, raw)
			b = append(b, ':')
			b = n.elems[i].appendJSON(b, raw)
		}
		return append(b, '}')
	case 'a':
		b = append(b, '[')
		for i, e := range n.elems {
			if i > 0 {
				b = append(b, ',')
			}
			b = e.appendJSON(b, raw)
		}
		return append(b, ']')
	case 's':
		return appendString(b, n.str, raw)
	}
	return append(b, n.str...)
}

func appendString(b []byte, s string, raw bool) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\n' && !raw:
			b = append(b, '\\', 'n')
		case c < 0x20 && !raw:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// CheckText reports an error when s, the output of a command or a
// configuration error, holds anything a terminal or a log could take for
// something else: a byte below 0x20 other than '\n' (which separates lines),
// DEL, invalid UTF-8, or a rune strconv.IsPrint rejects (C1 controls,
// U+2028, bidirectional overrides, ...).
func CheckText(s string) error {
	for i, r := range s {
		switch {
		case r == '\n':
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			return errorf("invalid UTF-8 at byte %d of %q", i, s)
		case !strconv.IsPrint(r):
			return errorf("unprintable %U at byte %d of %q", r, i, s)
		}
	}
	return nil
}

// PathNames checks that path is written in the syntax of configuration
// error paths — members as .name (letters, digits, '_', '-') or ["quoted"]
// (strconv.Quote, optionally cut: ["prefix"...]), indexes as [N], the
// first member without its dot — and returns the names of its members,
// unquoted, with cut[i] set for a name that is only a prefix.
func PathNames(path string) (names []string, cut []bool, err error) {
	s := path
	first := true
	for s != "" {
		switch {
		case s[0] == '[' && len(s) > 1 && s[1] == '"':
			end := 2
			for end < len(s) && s[end] != '"' {
				if s[end] == '\\' {
					end++
				}
				end++
			}
			if end >= len(s) {
				return nil, nil, errorf("unterminated quoted name in %q", path)
			}
			name, uerr := strconv.Unquote(s[1 : end+1])
			if uerr != nil {
				return nil, nil, errorf("bad quoted name %s in %q: %v", s[1:end+1], path, uerr)
			}
			if strconv.Quote(name) != s[1:end+1] {
				return nil, nil, errorf("quoted name %s in %q is not in strconv.Quote form", s[1:end+1], path)
			}
			rest := s[end+1:]
			c := strings.HasPrefix(rest, "...")
			if c {
				rest = rest[3:]
			}
			if !strings.HasPrefix(rest, "]") {
				return nil, nil, errorf("quoted name not closed by ] in %q", path)
			}
			names, cut = append(names, name), append(cut, c)
			s = rest[1:]
		case s[0] == '[':
			end := strings.IndexByte(s, ']')
			if end < 2 {
				return nil, nil, errorf("bad index in %q", path)
			}
			if _, perr := strconv.ParseUint(s[1:end], 10, 31); perr != nil || (s[1] == '0' && end > 2) {
				return nil, nil, errorf("bad index %q in %q", s[1:end], path)
			}
			s = s[end+1:]
		default:
			if !first {
				if s[0] != '.' {
					return nil, nil, errorf("expected . or [ at %q in %q", s, path)
				}
				s = s[1:]
			}
			end := 0
			for end < len(s) && (s[end] >= 'a' && s[end] <= 'z' || s[end] >= 'A' && s[end] <= 'Z' || s[end] >= '0' && s[end] <= '9' || s[end] == '_' || s[end] == '-') {
				end++
			}
			if end == 0 {
				return nil, nil, errorf("empty member name at %q in %q", s, path)
			}
			names, cut = append(names, s[:end]), append(cut, false)
			s = s[end:]
		}
		first = false
	}
	return names, cut, nil
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// TextMutations returns n configurations derived from Valid() by one to
// three edits of the text itself, not of its JSON tree: bytes inserted,
// deleted, replaced or repeated (Hostile() strings and JSON or YAML
// punctuation among them), the text cut short, a UTF-8 byte-order mark or
// whitespace put before it, and the whole file replaced by a JSON scalar
// or array (true, 0, null, "x", []). Most are invalid JSON; what a reader
// makes of them is for the tests to decide. seed makes the sequence
// reproducible.
func TextMutations(seed uint64, n int) []Case {
	rng := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	valid := Valid()
	hostile := append(Hostile(), "{", "}", ",", ":", "---\n", "- ", "#", "\ufeff", "\xef\xbb", "kind: x\n", "a: b\n")
	scalars := []string{"true", "false", "0", "-1.5e3", "null", `"x"`, "[]", `[{}]`, "{}", " true\n", "0\n"}
	out := make([]Case, 0, n)
	for i := 0; i < n; i++ {
		k := rng.IntN(len(valid))
		b := append([]byte(nil), valid[k].JSON...)
		var what []string
		for e := 1 + rng.IntN(3); e > 0; e-- {
			var w string
			b, w = mutateText(rng, b, hostile, scalars)
			what = append(what, w)
		}
		out = append(out, Case{
			Name: valid[k].Name + "/text-" + strconv.Itoa(i) + ":" + strings.Join(what, ","),
			JSON: b,
		})
	}
	return out
}

// mutateText applies one random edit to the text b and says which.
func mutateText(rng *rand.Rand, b []byte, hostile, scalars []string) ([]byte, string) {
	at := func() int { return rng.IntN(len(b) + 1) }
	switch rng.IntN(10) {
	case 0, 1: // insert a hostile string or punctuation
		i, s := at(), pick(rng, hostile)
		return append(b[:i:i], append([]byte(s), b[i:]...)...), "insert"
	case 2, 3: // delete a short span
		i := at()
		j := min(len(b), i+1+rng.IntN(8))
		return append(b[:i:i], b[j:]...), "delete"
	case 4: // replace one byte
		if len(b) == 0 {
			return b, "none"
		}
		b[rng.IntN(len(b))] = byte(rng.IntN(256))
		return b, "replace-byte"
	case 5: // repeat a span
		i := at()
		j := min(len(b), i+rng.IntN(16))
		return append(b[:j:j], append(append([]byte(nil), b[i:j]...), b[j:]...)...), "repeat"
	case 6: // cut short
		return b[:at()], "truncate"
	case 7: // a byte-order mark, whitespace, or both, before the text
		p := pick(rng, []string{"\ufeff", "\ufeff\ufeff", " \n\t", "\ufeff\r\n", "\xef\xbb", "\xef\xbb\xbf\xef\xbb"})
		return append([]byte(p), b...), "prefix"
	case 8: // the whole file a scalar or an array
		return []byte(pick(rng, scalars)), "scalar"
	}
	// A byte-order mark before the text as it is.
	return append([]byte("\ufeff"), b...), "bom"
}
