//go:build wasip1 && !nogrpc

package abi

import "unsafe"

// The gRPC call and the calls that resume a paused stream from a later
// callback, imported by both artifacts (every Envoy ≥ 1.33 provides them).
// The tetratelabs proxytest emulator has no proxy_grpc_call: tests that
// drive the module there build it with the tag nogrpc, which leaves this
// file out (Imports then has no GrpcCall and the rls backend refuses to
// configure).

//go:wasmimport env proxy_grpc_call
func proxyGrpcCall(service unsafe.Pointer, serviceSize uint32, serviceName unsafe.Pointer, serviceNameSize uint32,
	method unsafe.Pointer, methodSize uint32, metadata unsafe.Pointer, metadataSize uint32,
	message unsafe.Pointer, messageSize uint32, timeoutMS uint32, retToken unsafe.Pointer) uint32

//go:wasmimport env proxy_grpc_cancel
func proxyGrpcCancel(token uint32) uint32

//go:wasmimport env proxy_done
func proxyDone() uint32

// GrpcCall sends one unary gRPC request (the serialized message) to method
// of serviceName on cluster (proxy_grpc_call; no initial metadata); the
// reply arrives in proxy_on_grpc_receive or proxy_on_grpc_close with the
// returned token.
func (*Imports) GrpcCall(cluster, serviceName, method string, message []byte, timeoutMS uint32) (uint32, Status) {
	outID = 0
	st := Status(proxyGrpcCall(strPtr(cluster), uint32(len(cluster)), strPtr(serviceName), uint32(len(serviceName)),
		strPtr(method), uint32(len(method)), nil, 0, bytesPtr(message), uint32(len(message)), timeoutMS, unsafe.Pointer(&outID)))
	return outID, st
}

// GrpcCancel abandons the call of token (proxy_grpc_cancel): no callback
// follows.
func (*Imports) GrpcCancel(token uint32) Status { return Status(proxyGrpcCancel(token)) }

// Done tells the host that the root context which answered false from
// proxy_on_done has finished (proxy_done; cpp-host's WasmBase::done, which
// then deletes it). Only the rls backend needs it (its lease returns are
// gRPC calls, which the host cancels when the root is deleted), so it lives
// with the gRPC imports.
func (*Imports) Done() Status { return Status(proxyDone()) }

//go:wasmexport proxy_on_grpc_receive
func proxyOnGrpcReceive(rootID, token, size uint32) {
	var ret uint32
	enter()
	defer leave(&ret, 0)
	if h, ok := handler.(GrpcHandler); ok {
		h.OnGrpcReceive(rootID, token, int(size))
	}
}

//go:wasmexport proxy_on_grpc_close
func proxyOnGrpcClose(rootID, token, status uint32) {
	var ret uint32
	enter()
	defer leave(&ret, 0)
	if h, ok := handler.(GrpcHandler); ok {
		h.OnGrpcClose(rootID, token, status)
	}
}

// A unary call never gets metadata callbacks from Envoy (its request
// callbacks have none); they are exported so a host that sends them finds
// them, and ignored.

//go:wasmexport proxy_on_grpc_receive_initial_metadata
func proxyOnGrpcReceiveInitialMetadata(rootID, token, headers uint32) {}

//go:wasmexport proxy_on_grpc_receive_trailing_metadata
func proxyOnGrpcReceiveTrailingMetadata(rootID, token, trailers uint32) {}
