//go:build !redis

package filter

// RedisSupported reports whether this build has the Redis backend (build
// tag "redis", artifact sluice-redis.wasm). Without it a rule with
// backend "redis" is a configuration error.
const RedisSupported = false
