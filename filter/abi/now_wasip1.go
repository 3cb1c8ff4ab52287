//go:build wasip1

package abi

import "time"

// Now implements Host: WASI's wall clock, which every host serves (Envoy,
// the proxytest emulator, sluice's own host).
func (*Imports) Now() int64 { return time.Now().UnixNano() }
