package dynmod

import "github.com/sluice-proxy/sluice/filter/abi"

// effects are the calls into Envoy that can run Envoy's code back into the module — a local
// reply (which can end the stream at once) and resuming a paused request (which runs the
// rest of the filter chain, and the router's own local replies) — kept until the worker's
// lock is released and the VM's callback has returned, then made in order. Envoy may call
// any hook of the worker from within them, on the same thread, and finds the lock free and
// the VM between callbacks, as a Wasm VM is when Envoy defers its local replies.
type effects struct {
	list []effect
	buf  []byte // packed headers, bodies and details of the replies
}

type effect struct {
	resume  bool // continue decoding; else a local reply
	f       filterPtr
	status  int
	nhdrs   int
	hdrs    span
	body    span
	details span
}

type span struct{ from, to int }

func (fx *effects) add(b []byte) span {
	from := len(fx.buf)
	fx.buf = append(fx.buf, b...)
	return span{from, len(fx.buf)}
}

func (fx *effects) get(s span) []byte { return fx.buf[s.from:s.to:s.to] }

func (fx *effects) resume(f filterPtr) { fx.list = append(fx.list, effect{resume: true, f: f}) }

// reply queues a local reply with headers and, when grpcStatus is set, a grpc-status header.
func (fx *effects) reply(f filterPtr, status int, headers []abi.Header, grpcStatus, body []byte, details string) {
	e := effect{f: f, status: status}
	from := len(fx.buf)
	var n int
	fx.buf, n = packHeaders(fx.buf, headers)
	if grpcStatus != nil {
		var m int
		fx.buf, m = packHeaders(fx.buf, []abi.Header{{Name: "grpc-status", Value: grpcStatus}})
		n += m
	}
	e.hdrs, e.nhdrs = span{from, len(fx.buf)}, n
	e.body = fx.add(body)
	from = len(fx.buf)
	fx.buf = append(fx.buf, details...)
	e.details = span{from, len(fx.buf)}
	fx.list = append(fx.list, e)
}

// run makes the calls, in order, and empties fx.
func (fx *effects) run(env envoy) {
	for i := range fx.list {
		e := &fx.list[i]
		if e.resume {
			env.continueDecoding(e.f)
			continue
		}
		env.sendResponse(e.f, e.status, fx.get(e.hdrs), e.nhdrs, fx.get(e.body), string(fx.get(e.details)))
	}
	fx.list = fx.list[:0]
	fx.buf = fx.buf[:0]
}

// packHeaders appends hdrs to dst as the C side reads them: for each, the name's and the
// value's lengths (uint16, little-endian), the name, the value. A header whose name or value
// is longer than 65,535 bytes is left out (sluice's own headers are a few dozen bytes).
func packHeaders(dst []byte, hdrs []abi.Header) ([]byte, int) {
	n := 0
	for i := range hdrs {
		name, value := hdrs[i].Name, hdrs[i].Value
		if len(name) > 0xffff || len(value) > 0xffff {
			continue
		}
		dst = append(dst, byte(len(name)), byte(len(name)>>8), byte(len(value)), byte(len(value)>>8))
		dst = append(append(dst, name...), value...)
		n++
	}
	return dst, n
}

// unpackHeaders calls f for each header packHeaders packed.
func unpackHeaders(b []byte, n int, f func(name, value []byte)) {
	for i := 0; i < n && len(b) >= 4; i++ {
		nl, vl := int(b[0])|int(b[1])<<8, int(b[2])|int(b[3])<<8
		if len(b) < 4+nl+vl {
			return
		}
		f(b[4:4+nl], b[4+nl:4+nl+vl])
		b = b[4+nl+vl:]
	}
}
