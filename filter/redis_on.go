//go:build redis

package filter

// RedisSupported reports whether this build has the Redis backend (build
// tag "redis", artifact sluice-redis.wasm).
//
// TODO(issue 5): the Redis store is not implemented yet; until it is, the
// redis build refuses Redis rules like the local build does.
const RedisSupported = false
