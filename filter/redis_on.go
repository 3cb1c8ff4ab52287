//go:build redis

package filter

// RedisSupported reports whether this build has the Redis backend's host
// calls (build tag "redis", artifact sluice-redis.wasm): its abi.Imports
// implements RedisHost. The plugin accepts rules with backend "redis" when
// its host implements RedisHost, so sluice.wasm refuses them.
const RedisSupported = true
