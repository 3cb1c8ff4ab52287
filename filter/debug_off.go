//go:build !sluice_debug

package filter

const debugAllocs = false

func (vm *VM) reportAllocs() {}
