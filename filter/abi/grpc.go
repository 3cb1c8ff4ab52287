package abi

import "github.com/sluice-proxy/sluice/proxywasm"

// Proxy-Wasm's gRPC calls (proxy_grpc_call and its callbacks), which
// sluice.wasm imports for the rate-limit service backend (backend "rls").
// Every Envoy with ABI 0.2.1 provides them (proxy-wasm-cpp-host
// src/exports.cc grpc_call; Envoy source/extensions/common/wasm/context.cc
// Context::grpcCall). A unary call made with proxy_grpc_call belongs to the
// root context (cpp-host calls grpcCall on root_context()); its reply arrives
// as proxy_on_grpc_receive (the response message, read as
// BufferGrpcReceive) or, on failure, as proxy_on_grpc_close with the gRPC
// status code — never both (Envoy's GrpcCallClientHandler: onSuccessRaw →
// onGrpcReceiveWrapper, onFailure → onGrpcCloseWrapper).

// BufferGrpcReceive is the buffer holding a gRPC reply during
// proxy_on_grpc_receive.
const BufferGrpcReceive = proxywasm.BufferGrpcReceive

// GrpcHandler is implemented by a Handler that receives gRPC replies. The
// exports dispatch to it (found by type assertion); rootID is the root
// context that made the call.
type GrpcHandler interface {
	// OnGrpcReceive is proxy_on_grpc_receive: the reply message of token,
	// size bytes, readable as BufferGrpcReceive during the call.
	OnGrpcReceive(rootID, token uint32, size int)
	// OnGrpcClose is proxy_on_grpc_close: the call of token failed with
	// gRPC status code status (nonzero).
	OnGrpcClose(rootID, token, status uint32)
}
