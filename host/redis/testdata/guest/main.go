// Command guest is the test guest of package host/redis: a Proxy-Wasm filter in standard Go
// that sends the Redis commands of a request header through Higress's Redis host calls and
// answers with the replies. It is test code: small, explicit, no SDK.
//
// Plugin configuration: "SERVICE USER PASSWORD TIMEOUT_MS" (use - for an empty field).
// Request header x-redis: commands separated by '|', arguments by ' '. All are sent at once;
// when every reply is in, the guest answers 200 with "status:reply" per command, one a line,
// or, with x-mode: continue, resumes the request with the same text in x-redis-replies.
package main

import (
	"encoding/binary"
	"strconv"
	"strings"
	"unsafe"
)

func main() {}

//go:wasmimport env proxy_log
func hLog(level uint32, p unsafe.Pointer, n uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func hGetBuffer(t, start, max uint32, rp, rn unsafe.Pointer) uint32

//go:wasmimport env proxy_get_header_map_value
func hGetHeader(t uint32, kp unsafe.Pointer, kn uint32, rp, rn unsafe.Pointer) uint32

//go:wasmimport env proxy_add_header_map_value
func hAddHeader(t uint32, kp unsafe.Pointer, kn uint32, vp unsafe.Pointer, vn uint32) uint32

//go:wasmimport env proxy_send_local_response
func hSendLocal(status uint32, dp unsafe.Pointer, dn uint32, bp unsafe.Pointer, bn uint32, hp unsafe.Pointer, hn uint32, grpc int32) uint32

//go:wasmimport env proxy_continue_stream
func hContinue(t uint32) uint32

//go:wasmimport env proxy_set_effective_context
func hSetEffective(id uint32) uint32

//go:wasmimport env proxy_redis_init
func hRedisInit(sp unsafe.Pointer, sn uint32, up unsafe.Pointer, un uint32, pp unsafe.Pointer, pn uint32, timeoutMS uint32) uint32

//go:wasmimport env proxy_redis_call
func hRedisCall(sp unsafe.Pointer, sn uint32, qp unsafe.Pointer, qn uint32, rtoken unsafe.Pointer) uint32

// pinned keeps host-written buffers alive until the next callback has copied them.
var pinned [][]byte

//go:wasmexport proxy_on_memory_allocate
func onAlloc(size uint32) uint32 {
	if size == 0 {
		size = 1
	}
	b := make([]byte, size)
	pinned = append(pinned, b)
	return uint32(uintptr(unsafe.Pointer(&b[0])))
}

func enter() { pinned = pinned[:0] }

func sp(s string) (unsafe.Pointer, uint32) {
	if len(s) == 0 {
		return nil, 0
	}
	return unsafe.Pointer(unsafe.StringData(s)), uint32(len(s))
}

func str(p *byte, n uint32) string {
	if p == nil || n == 0 {
		return ""
	}
	return string(unsafe.Slice(p, n))
}

func logf(msg string) { p, n := sp(msg); hLog(4, p, n) }

func getHeader(k string) string {
	var p *byte
	var n uint32
	kp, kn := sp(k)
	hGetHeader(0, kp, kn, unsafe.Pointer(&p), unsafe.Pointer(&n))
	return str(p, n)
}

func addHeader(k, v string) {
	kp, kn := sp(k)
	vp, vn := sp(v)
	hAddHeader(0, kp, kn, vp, vn)
}

func getBuffer(t, max uint32) (string, uint32) {
	var p *byte
	var n uint32
	st := hGetBuffer(t, 0, max, unsafe.Pointer(&p), unsafe.Pointer(&n))
	return str(p, n), st
}

func sendLocal(status uint32, body string, headers [][2]string) {
	size := 4
	for _, p := range headers {
		size += 8 + len(p[0]) + len(p[1]) + 2
	}
	h := make([]byte, size)
	binary.LittleEndian.PutUint32(h, uint32(len(headers)))
	o := 4
	for _, p := range headers {
		binary.LittleEndian.PutUint32(h[o:], uint32(len(p[0])))
		binary.LittleEndian.PutUint32(h[o+4:], uint32(len(p[1])))
		o += 8
	}
	for _, p := range headers {
		o += copy(h[o:], p[0]) + 1
		o += copy(h[o:], p[1]) + 1
	}
	bp, bn := sp(body)
	hSendLocal(status, nil, 0, bp, bn, unsafe.Pointer(&h[0]), uint32(len(h)), -1)
}

// resp encodes a command as a RESP array of bulk strings.
func resp(args []string) []byte {
	b := []byte("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b = append(b, "$"+strconv.Itoa(len(a))+"\r\n"+a+"\r\n"...)
	}
	return b
}

var (
	service    string
	initStatus uint32
	tokens     = map[uint32]slot{} // token -> the stream's pending call
)

type slot struct {
	p *pending
	i int // index of the command
}

type pending struct {
	ctx      uint32
	cont     bool
	replies  []string
	missing  int
	callback string // context id the callbacks arrived with
}

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {}

//go:wasmexport proxy_on_vm_start
func onVMStart(root, size uint32) uint32 { return 1 }

//go:wasmexport proxy_on_configure
func onConfigure(root, size uint32) uint32 {
	enter()
	cfg, _ := getBuffer(7, size)
	f := strings.Fields(cfg)
	for len(f) < 4 {
		f = append(f, "-")
	}
	for i := range f {
		if f[i] == "-" {
			f[i] = ""
		}
	}
	service = f[0]
	timeout, _ := strconv.Atoi(f[3])
	s, sn := sp(f[0])
	u, un := sp(f[1])
	p, pn := sp(f[2])
	initStatus = hRedisInit(s, sn, u, un, p, pn, uint32(timeout))
	return 1
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	enter()
	cmds := getHeader("x-redis")
	if cmds == "" {
		return 0
	}
	svc := service
	if s := getHeader("x-service"); s != "" {
		svc = s
	}
	p := &pending{ctx: id, cont: getHeader("x-mode") == "continue"}
	list := strings.Split(cmds, "|")
	p.replies = make([]string, len(list))
	for i, c := range list {
		q := resp(strings.Fields(c))
		if c == "garbage" {
			q = []byte("not resp")
		}
		var token uint32
		sp_, sn := sp(svc)
		st := hRedisCall(sp_, sn, unsafe.Pointer(&q[0]), uint32(len(q)), unsafe.Pointer(&token))
		if st != 0 {
			// Calls already made are answered later; their tokens are dropped with p.
			for t, x := range tokens {
				if x.p == p {
					delete(tokens, t)
				}
			}
			sendLocal(500, "call "+strconv.Itoa(i)+" status="+strconv.Itoa(int(st))+" init="+strconv.Itoa(int(initStatus)), nil)
			return 1
		}
		if tokens[token].p != nil {
			logf("token reused while pending")
		}
		tokens[token] = slot{p, i}
		p.missing++
	}
	return 1
}

//go:wasmexport proxy_on_redis_call_response
func onRedisCallResponse(ctx, token, status, size uint32) {
	enter()
	sl := tokens[token]
	p := sl.p
	if p == nil {
		logf("reply for unknown token " + strconv.Itoa(int(token)))
		return
	}
	delete(tokens, token)
	reply, st := getBuffer(9, size)
	if st != 0 && size > 0 {
		reply = "buffer status " + strconv.Itoa(int(st))
	}
	p.replies[sl.i] = strconv.Itoa(int(status)) + ":" + strconv.Quote(reply)
	p.callback = strconv.Itoa(int(ctx))
	p.missing--
	if p.missing > 0 {
		return
	}
	if hSetEffective(p.ctx) != 0 {
		logf("stream gone")
		return
	}
	body := strings.Join(p.replies, "\n")
	hdrs := [][2]string{{"x-callback-context", p.callback}, {"x-stream-context", strconv.Itoa(int(p.ctx))}}
	if p.cont {
		addHeader("x-redis-replies", strconv.Quote(body))
		addHeader("x-callback-context", p.callback)
		hContinue(0)
		return
	}
	sendLocal(200, body, hdrs)
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 { return 0 }

//go:wasmexport proxy_on_log
func onLog(id uint32) {}

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 { return 1 }

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {}
