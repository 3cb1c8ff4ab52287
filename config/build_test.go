package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
)

// TestRedisParams pins the Redis scripts' bounds (moved here from
// internal/redisrl, whose conformance tests run the scripts at them).
func TestRedisParams(t *testing.T) {
	ok := []struct {
		k algorithms.Kind
		p algorithms.Params
	}{
		{algorithms.TokenBucket, algorithms.Params{Limit: 100, Window: time.Hour}},
		{algorithms.LeakyBucket, algorithms.Params{Limit: 1_000_000, Window: time.Hour, Burst: 1_000_000}},
		{algorithms.SlidingWindow, algorithms.Params{Limit: 100_000, Window: 24 * time.Hour}},
		{algorithms.FixedWindow, algorithms.Params{Limit: algorithms.MaxLimit, Window: algorithms.MaxWindow}},
		{algorithms.SlidingLog, algorithms.Params{Limit: algorithms.MaxSlidingLogLimit, Window: algorithms.MaxWindow}},
		{algorithms.FixedWindow, algorithms.Params{Limit: 1, Window: time.Microsecond}},
	}
	for _, c := range ok {
		if err := RedisParams(c.k, c.p); err != nil {
			t.Errorf("%v %+v: %v", c.k, c.p, err)
		}
	}
	bad := []struct {
		k    algorithms.Kind
		p    algorithms.Params
		want string
	}{
		{algorithms.FixedWindow, algorithms.Params{Limit: 1, Window: 1500 * time.Nanosecond}, "window must be a positive whole number of microseconds for the redis backend"},
		{algorithms.TokenBucket, algorithms.Params{Limit: 1, Window: 0}, "window must be a positive whole number"},
		{algorithms.TokenBucket, algorithms.Params{Limit: 10, Window: 366 * 24 * time.Hour, Burst: 1_000_000}, "window is too long for this limit/burst on the redis backend"},
		{algorithms.SlidingWindow, algorithms.Params{Limit: algorithms.MaxLimit, Window: 24 * time.Hour}, "window is too long"},
		{0, algorithms.Params{Limit: 1, Window: time.Second}, "algorithm is unknown: 0"},
	}
	for _, c := range bad {
		err := RedisParams(c.k, c.p)
		var pe *algorithms.ParamError
		if err == nil || !errors.As(err, &pe) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %+v: %v, want %q", c.k, c.p, err, c.want)
		}
	}
}

// TestRedisBoundsInParse: Parse applies RedisParams and the local fallback
// to Redis rules, at each boundary, and only to Redis rules.
func TestRedisBoundsInParse(t *testing.T) {
	redis := func(top string, kv ...string) string {
		return doc(top, rule(append([]string{"backend", `"redis"`}, kv...)...))
	}
	local := func(kv ...string) string { return doc(redisObj, rule(kv...)) }
	// 2^53 − MaxLimit over one day in µs: 104249.98…
	tb := []string{"algorithm", `"token_bucket"`, "window", `"1d"`}
	sw := []string{"algorithm", `"sliding_window"`, "window", `"1d"`}
	for _, tc := range []struct {
		json, want string
	}{
		{redis(redisObj, append(tb, "limit", "104249")...), ""},
		{redis(redisObj, append(tb, "limit", "104250")...), "rules[0].window: is too long for this limit/burst on the redis backend (limit × window in µs must stay below 2^53)"},
		{redis(redisObj, append(tb, "limit", "10", "burst", "104249")...), ""},
		{redis(redisObj, append(tb, "limit", "10", "burst", "104250")...), "rules[0].window: is too long for this limit/burst on the redis backend (limit × window in µs must stay below 2^53)"},
		{redis(redisObj, append(sw, "limit", "104249")...), ""},
		{redis(redisObj, append(sw, "limit", "104250")...), "rules[0].window: is too long for this limit/burst on the redis backend (limit × window in µs must stay below 2^53)"},
		{redis(redisObj, "algorithm", `"fixed_window"`, "limit", "1000000000", "window", `"366d"`), ""},
		{local(append(tb, "limit", "104250")...), ""},
		{local(append(sw, "limit", "1000000000")...), ""},
		// The fallback of limit 3, burst B over 1d with 2 instances is
		// limit 1, burst B/2: it refills in B/2 days, at most 36600.
		{redis(`"redis":{"cluster":"r","instances":2}`, append(tb, "limit", "3", "burst", "73201")...), ""},
		{redis(`"redis":{"cluster":"r","instances":2}`, append(tb, "limit", "3", "burst", "73202")...), "rules[0].burst: is too large for this limit and window: refilling it would take more than 100 years in the local fallback (limit 1 and burst 36601: divided by redis.instances 2)"},
		{redis(`"redis":{"cluster":"r","instances":1}`, append(tb, "limit", "3", "burst", "73202")...), ""},
		{redis(`"redis":{"cluster":"r","instances":2}`, "algorithm", `"leaky_bucket"`, "window", `"1d"`, "limit", "3", "burst", "73202"), "rules[0].burst: is too large for this limit and window: refilling it would take more than 100 years in the local fallback (limit 1 and burst 36601: divided by redis.instances 2)"},
	} {
		c, err := Parse([]byte(tc.json))
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("Parse(%s)\n got: %s\nwant: %s", tc.json, got, tc.want)
			continue
		}
		if err != nil {
			continue
		}
		r := c.Rules[0]
		if (r.Backend == BackendRedis) != (r.Fallback != nil) {
			t.Errorf("%s: backend %v, fallback %v", tc.json, r.Backend, r.Fallback)
		}
		if r.Fallback != nil {
			if want := FallbackParams(r.Limiter.Params(), c.Redis.Instances); r.Fallback.Params() != want || r.Fallback.Kind() != r.Algorithm {
				t.Errorf("%s: fallback %v %+v, want %+v", tc.json, r.Fallback.Kind(), r.Fallback.Params(), want)
			}
		}
	}
}

func TestFallbackParams(t *testing.T) {
	for _, tc := range []struct {
		in        algorithms.Params
		instances int
		want      algorithms.Params
	}{
		{algorithms.Params{Limit: 100, Window: time.Second, Burst: 20}, 3, algorithms.Params{Limit: 33, Window: time.Second, Burst: 6}},
		{algorithms.Params{Limit: 2, Window: time.Second, Burst: 1}, 5, algorithms.Params{Limit: 1, Window: time.Second, Burst: 1}},
		{algorithms.Params{Limit: 7, Window: time.Minute}, 1, algorithms.Params{Limit: 7, Window: time.Minute}},
		{algorithms.Params{Limit: 7, Window: time.Minute}, 0, algorithms.Params{Limit: 7, Window: time.Minute}},
	} {
		if got := FallbackParams(tc.in, tc.instances); got != tc.want {
			t.Errorf("FallbackParams(%+v, %d) = %+v, want %+v", tc.in, tc.instances, got, tc.want)
		}
	}
}

// TestParseForLocal: sluice.wasm refuses Redis rules, saying why, in
// document order with the other errors; it accepts what has none.
func TestParseForLocal(t *testing.T) {
	const why = `"redis" needs sluice-redis.wasm (a host with Higress's Redis calls); sluice.wasm has the "local" and "rls" backends only`
	for _, tc := range []struct {
		json, want string
	}{
		{doc(redisObj, rule("backend", `"redis"`)), "rules[0].backend: " + why},
		// Both problems at once: the build, and the missing "redis" object.
		{doc("", rule("backend", `"redis"`)), "rules[0].backend: " + why + "\nrules[0].backend: \"redis\" needs a top-level \"redis\" object"},
		{doc(`"failure_mode":"local",`+redisObj, rule("name", `"a"`), rule("name", `"b"`, "backend", `"redis"`, "limit", "0")),
			"rules[1].limit: 0 is out of range 1..1000000000\nrules[1].backend: " + why},
		{doc(redisObj, rule("backend", `"local"`)), ""},
		{doc(`"failure_mode":"local",`+redisObj, rule()), `failure_mode: "local" needs at least one rule with backend "redis" or "rls"`},
	} {
		c, err := ParseFor([]byte(tc.json), BuildLocal)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.want || (err == nil) == (c == nil) {
			t.Errorf("ParseFor(%s, BuildLocal)\n got: %s\nwant: %s", tc.json, got, tc.want)
		}
		// BuildRedis is Parse.
		c1, err1 := ParseFor([]byte(tc.json), BuildRedis)
		c2, err2 := Parse([]byte(tc.json))
		if (c1 == nil) != (c2 == nil) || (err1 == nil) != (err2 == nil) || err1 != nil && err1.Error() != err2.Error() {
			t.Errorf("ParseFor(BuildRedis) %v, Parse %v", err1, err2)
		}
	}
	if BuildLocal.String() != "sluice.wasm" || BuildRedis.String() != "sluice-redis.wasm" {
		t.Errorf("build names %s %s", BuildLocal, BuildRedis)
	}
}
