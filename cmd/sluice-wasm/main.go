// Command sluice-wasm is the sluice Proxy-Wasm module. Build it with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o sluice.wasm ./cmd/sluice-wasm
//
// (add -tags redis for sluice-redis.wasm). A c-shared module runs package
// initialisers from _initialize and never runs main; the Handler is
// installed in init (register_wasip1.go).
package main

func main() {}
