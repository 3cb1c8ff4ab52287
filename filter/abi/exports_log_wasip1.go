//go:build wasip1 && proxytest

package abi

// proxy_on_log, for the module the proxytest emulator runs (build tag proxytest): the
// emulator calls it at the end of every stream and fails on a missing export. The module
// make build ships does not export it (see exports_wasip1.go).

//go:wasmexport proxy_on_log
func proxyOnLog(id uint32) {
	enter()
	defer func() {
		depth--
		if r := recover(); r != nil {
			recovered(r)
		}
	}()
	handler.OnLog(id)
}
