// Command sluice-dynmod is sluice as an Envoy dynamic module (libsluice.so): the filter of
// sluice.wasm, natively, in Envoy's process. Build it with
//
//	CGO_ENABLED=1 go build -buildmode=c-shared -o libsluice.so ./cmd/sluice-dynmod
//
// (make build does, into dist/). Envoy loads it with the dynamic_modules HTTP filter; the
// package filter/dynmod holds the binding and docs/deploy.md the bootstrap.
package main

import _ "github.com/sluice-proxy/sluice/filter/dynmod"

func main() {}
