// Command counter is a Proxy-Wasm filter that does, per request, what any exact limiter on
// Proxy-Wasm shared data must and nothing else: it reads the key header (x-key), the clock,
// and the key's shared-data entry, and writes the entry back with compare-and-swap (a
// count and the time, 25 bytes as sluice's slot of a token bucket), retrying a lost race.
// It decides nothing and lets every request through, and exports only the callbacks a
// stream needs (no proxy_on_log, as sluice.wasm: one call into the module fewer).
// bench/envoy measures it next to Envoy's native local_ratelimit and sluice's admissions
// (family admit-floor): the least an exact shared-data limiter in a standard-Go module
// costs in a host.
package main

import (
	"encoding/binary"
	"unsafe"
)

func main() {}

const (
	mapRequestHeaders = 0
	statusOK          = 0
	statusNotFound    = 1
	statusCASMismatch = 8
	maxRetries        = 8
	valueSize         = 25
)

var (
	keyHeader = []byte("x-key")
	prefix    = "floor:"
	key       = make([]byte, 0, 256)
	value     [valueSize]byte
	// arena holds what the host returns during one callback (the header's value and the
	// entry); proxy_on_request_headers starts it afresh, so a request allocates nothing.
	arena    [16 << 10]byte
	arenaOff int
)

//go:wasmimport env proxy_get_header_map_value
func getHeaderMapValue(mapType uint32, keyPtr unsafe.Pointer, keyLen uint32, valuePtr, valueLen unsafe.Pointer) uint32

//go:wasmimport env proxy_get_current_time_nanoseconds
func getCurrentTime(t unsafe.Pointer) uint32

//go:wasmimport env proxy_get_shared_data
func getSharedData(keyPtr unsafe.Pointer, keyLen uint32, valuePtr, valueLen, cas unsafe.Pointer) uint32

//go:wasmimport env proxy_set_shared_data
func setSharedData(keyPtr unsafe.Pointer, keyLen uint32, valuePtr unsafe.Pointer, valueLen uint32, cas uint32) uint32

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_memory_allocate
func onAlloc(size uint32) uint32 {
	n := int(size)
	if arenaOff+n+1 > len(arena) {
		b := make([]byte, n+1)
		return uint32(uintptr(unsafe.Pointer(&b[0])))
	}
	p := &arena[arenaOff]
	arenaOff += (n + 8) &^ 7
	return uint32(uintptr(unsafe.Pointer(p)))
}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	arenaOff = 0
	var vp *byte // the host writes a 32-bit address into its low half
	var vl uint32
	if getHeaderMapValue(mapRequestHeaders, unsafe.Pointer(&keyHeader[0]), uint32(len(keyHeader)),
		unsafe.Pointer(&vp), unsafe.Pointer(&vl)) != statusOK || vp == nil || vl == 0 {
		return 0
	}
	key = append(append(key[:0], prefix...), unsafe.Slice(vp, vl)...)
	var now uint64
	getCurrentTime(unsafe.Pointer(&now))
	for range maxRetries {
		var sp *byte
		var sl, cas uint32
		count := uint64(0)
		switch getSharedData(unsafe.Pointer(&key[0]), uint32(len(key)), unsafe.Pointer(&sp), unsafe.Pointer(&sl), unsafe.Pointer(&cas)) {
		case statusOK:
			if sp != nil && sl >= 8 {
				count = binary.LittleEndian.Uint64(unsafe.Slice(sp, sl))
			}
		case statusNotFound:
			cas = 0
		default:
			return 0
		}
		binary.LittleEndian.PutUint64(value[0:], count+1)
		binary.LittleEndian.PutUint64(value[8:], now)
		if setSharedData(unsafe.Pointer(&key[0]), uint32(len(key)), unsafe.Pointer(&value[0]), valueSize, cas) != statusCASMismatch {
			return 0
		}
	}
	return 0
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 { return 0 }

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 { return 1 }

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {}
