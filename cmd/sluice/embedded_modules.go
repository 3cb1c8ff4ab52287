//go:build embedwasm

package main

import _ "embed"

// The modules `make build` copies here before building with -tags embedwasm.
var (
	//go:embed embedded/sluice.wasm
	embeddedWasm []byte
	//go:embed embedded/sluice-redis.wasm
	embeddedRedisWasm []byte
)

func init() {
	builtinModules.local, builtinModules.redis = embeddedWasm, embeddedRedisWasm
}
