//go:build wasip1 && redis

package abi

import "unsafe"

// Higress's Redis extension to Proxy-Wasm. Only sluice-redis.wasm (build
// tag redis) imports it: a module importing proxy_redis_* does not link on
// upstream Envoy, and sluice.wasm must stay loadable there (the imports test
// pins both lists). The calls that resume a paused stream are in
// resume_wasip1.go (both artifacts).

//go:wasmimport env proxy_redis_init
func proxyRedisInit(service unsafe.Pointer, serviceSize uint32, user unsafe.Pointer, userSize uint32, pass unsafe.Pointer, passSize uint32, timeoutMS uint32) uint32

//go:wasmimport env proxy_redis_call
func proxyRedisCall(service unsafe.Pointer, serviceSize uint32, query unsafe.Pointer, querySize uint32, retToken unsafe.Pointer) uint32

// RedisInit binds service to credentials and a per-call timeout
// (proxy_redis_init).
func (*Imports) RedisInit(service, username, password string, timeoutMS uint32) Status {
	return Status(proxyRedisInit(strPtr(service), uint32(len(service)), strPtr(username), uint32(len(username)), strPtr(password), uint32(len(password)), timeoutMS))
}

// RedisCall sends one RESP command to service (proxy_redis_call); the reply
// arrives in proxy_on_redis_call_response with the returned token.
func (*Imports) RedisCall(service string, query []byte) (uint32, Status) {
	outID = 0
	st := Status(proxyRedisCall(strPtr(service), uint32(len(service)), bytesPtr(query), uint32(len(query)), unsafe.Pointer(&outID)))
	return outID, st
}

// RedisHandler is implemented by a Handler that receives Redis replies.
type RedisHandler interface {
	// OnRedisCallResponse is proxy_on_redis_call_response: the reply of
	// token, read as buffer BufferRedisCallResponse (size bytes) during the
	// call. rootID is the root context that owns the call; status is a
	// RedisStatus: RedisStatusOK with a reply from Redis, anything else a
	// failure with no reply.
	OnRedisCallResponse(rootID, token, status uint32, size int)
}

//go:wasmexport proxy_on_redis_call_response
func proxyOnRedisCallResponse(rootID, token, status, size uint32) {
	var ret uint32
	enter()
	defer leave(&ret, 0)
	if h, ok := handler.(RedisHandler); ok {
		h.OnRedisCallResponse(rootID, token, status, int(size))
	}
}
