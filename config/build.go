package config

import (
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config/internal/jsonv"
)

// Build is the module a configuration is validated for. The two artifacts
// accept different configurations: only sluice-redis.wasm has the Redis
// backend, and its rules carry the Redis scripts' bounds. The filter parses
// with the Build it is (ParseFor), and `sluice check` with the one it is
// told (--redis), so both run the same validation: what check accepts, the
// module loads.
type Build uint8

const (
	// BuildLocal is sluice.wasm (upstream Envoy, Istio): the local backend
	// only; a rule with backend "redis" is an error.
	BuildLocal Build = iota
	// BuildRedis is sluice-redis.wasm (Higress, or any host with its Redis
	// calls): both backends; Redis rules must also satisfy RedisParams and
	// their local fallback (Rule.Fallback) must be a valid limiter.
	BuildRedis
	// BuildDynamic is libsluice.so, the Envoy dynamic module: the local backend only.
	// Envoy's dynamic-module ABI has no gRPC client and no Redis calls, so a rule with
	// backend "rls" or "redis" is an error (sluice.wasm has "rls").
	BuildDynamic
)

// String returns the artifact's file name.
func (b Build) String() string {
	switch b {
	case BuildRedis:
		return "sluice-redis.wasm"
	case BuildDynamic:
		return "libsluice.so"
	}
	return "sluice.wasm"
}

// backends names the backends b has, for the errors of the others.
func (b Build) backends() string {
	switch b {
	case BuildRedis:
		return `the "local", "rls" and "redis" backends`
	case BuildDynamic:
		return `the "local" backend only (Envoy's dynamic-module ABI has no gRPC client and no Redis calls: use sluice.wasm for "rls")`
	}
	return `the "local" and "rls" backends only`
}

// ParseFor is Parse for the module b: Parse accepts what sluice-redis.wasm
// loads (ParseFor(data, BuildRedis)); ParseFor(data, BuildLocal) also
// refuses Redis rules, as sluice.wasm does.
func ParseFor(data []byte, b Build) (*Config, error) {
	return parseFor(data, b)
}

// maxExactRedis is 2^53: the Redis scripts compute in Lua numbers
// (doubles), which hold every integer up to it.
const maxExactRedis = 1 << 53

// RedisParams reports whether limiter parameters (as normalised by
// algorithms.New: Burst = Limit for the window algorithms) can be enforced
// exactly by the Redis scripts (internal/redisrl): the window must be a
// whole number of microseconds, and the scaled capacity (burst × window in
// µs for the buckets, limit × window for sliding_window) must stay below
// 2^53 − MaxLimit so that every intermediate value of the scripts is an
// exact integer in a double. The error names the field like
// algorithms.ParamError. It is the one place these bounds are written:
// Parse applies them to every Redis rule, so the filter never sees
// parameters the scripts cannot take.
func RedisParams(k algorithms.Kind, p algorithms.Params) error {
	switch k {
	case algorithms.TokenBucket, algorithms.LeakyBucket, algorithms.FixedWindow, algorithms.SlidingLog, algorithms.SlidingWindow:
	default:
		return &algorithms.ParamError{Field: "algorithm", Reason: "is unknown: " + strconv.Itoa(int(k))}
	}
	if p.Window%time.Microsecond != 0 || p.Window <= 0 {
		return &algorithms.ParamError{Field: "window", Reason: "must be a positive whole number of microseconds for the redis backend"}
	}
	w := int64(p.Window / time.Microsecond)
	burst := p.Burst
	if burst == 0 {
		burst = p.Limit
	}
	var scaled int64
	switch k {
	case algorithms.TokenBucket, algorithms.LeakyBucket:
		scaled = burst
	case algorithms.SlidingWindow:
		scaled = p.Limit
	}
	if scaled > 0 && scaled > (maxExactRedis-algorithms.MaxLimit)/w {
		return &algorithms.ParamError{Field: "window", Reason: "is too long for this limit/burst on the redis backend (limit × window in µs must stay below 2^53)"}
	}
	return nil
}

// FallbackParams returns the parameters of a Redis rule's local fallback
// (failure_mode "local" while Redis cannot decide): Limit and Burst divided
// by instances, at least 1 each.
func FallbackParams(p algorithms.Params, instances int) algorithms.Params {
	n := int64(max(1, instances))
	fb := p
	fb.Limit = max(1, p.Limit/n)
	if fb.Burst != 0 {
		fb.Burst = max(1, p.Burst/n)
	}
	return fb
}

// redisRule applies the bounds of the Redis scripts to the remote rule r
// at path (the rule object v) — a Redis rule, or an RLS rule, which the
// service decides with the same scripts: RedisParams and a valid local
// fallback for instances (named by field), which it sets.
func (p *parser) redisRule(path string, v jsonv.Value, r *Rule, instances int, field string) {
	if r.Limiter == nil {
		return // reported already
	}
	if r.Concurrency != nil {
		r.Fallback = r.Limiter // unused: a remote in-flight limit has no local fallback (concurrency.go)
		return
	}
	par := r.Limiter.Params()
	bounded := true
	if err := RedisParams(r.Algorithm, par); err != nil {
		p.paramError(path, v, err, "") // and the fallback is still checked
		bounded = false
	}
	fb := FallbackParams(par, instances)
	l, err := algorithms.New(r.Algorithm, fb)
	if err != nil {
		p.paramError(path, v, err, " in the local fallback (limit "+strconv.FormatInt(fb.Limit, 10)+
			" and burst "+strconv.FormatInt(fb.Burst, 10)+": divided by "+field+" "+strconv.Itoa(instances)+")")
		return
	}
	if bounded {
		r.Fallback = l
	}
}
