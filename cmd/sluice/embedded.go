package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sluice-proxy/sluice/config"
)

// builtinModules are the Proxy-Wasm modules built into this binary. `make build` copies
// dist/sluice.wasm and dist/sluice-redis.wasm into cmd/sluice/embedded/ (not committed)
// and builds with -tags embedwasm (embedded_modules.go); a plain `go build` has none, and
// `sluice run` then looks for the modules as files (defaultWasm).
var builtinModules struct{ local, redis []byte }

// The names `sluice run` reports for a built-in module (its start-up line, its errors).
const (
	builtinLocal = "sluice.wasm (built in)"
	builtinRedis = "sluice-redis.wasm (built in)"
)

// defaultWasm chooses the module `sluice run` loads when --wasm is not given: the built-in
// sluice.wasm, or sluice-redis.wasm when the configuration at configPath needs it (it has a
// "redis" rule: refused by sluice.wasm, accepted by sluice-redis.wasm); without built-in
// modules, that file next to the executable, then in ./dist (a `go build` or `go run` in
// the repository). It returns "" when there is none (readWasm says what to do).
func defaultWasm(configPath string) string {
	redis := false
	if configPath != "" {
		if data, err := os.ReadFile(configPath); err == nil {
			_, errLocal := config.ParseFor(data, config.BuildLocal)
			_, errRedis := config.ParseFor(data, config.BuildRedis)
			redis = errLocal != nil && errRedis == nil
		}
	}
	builtin, name, file := builtinModules.local, builtinLocal, "sluice.wasm"
	if redis {
		builtin, name, file = builtinModules.redis, builtinRedis, "sluice-redis.wasm"
	}
	if builtin != nil {
		return name
	}
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Dir(exe))
	}
	for _, d := range append(dirs, "dist") {
		p := filepath.Join(d, file)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// readWasm reads the module that path names: a file, or a built-in module's name.
func readWasm(path string) ([]byte, error) {
	switch path {
	case builtinLocal:
		return builtinModules.local, nil
	case builtinRedis:
		return builtinModules.redis, nil
	case "":
		return nil, errors.New("no Proxy-Wasm module: this sluice was built without the modules built in (`make build` builds them in) and none is next to it or in ./dist; build with `make build`, or pass --wasm FILE")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading --wasm: %v", err)
	}
	return b, nil
}
