//go:build sluice_nogosched

package filter

// GoschedEvery: effectively never (experiment build, see gosched.go).
const GoschedEvery = 1 << 31
