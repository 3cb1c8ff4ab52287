package host

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// Request headers held while the body flows: Envoy's allow_on_headers_stop_iteration
// (Options.AllowOnHeadersStopIteration; see doc.go, Pause and the request body).
//
// The worker owns a held stream throughout (waiting stays true, so a tick may make it the
// effective context and continue it). The Handler's goroutine reads the body and hands each
// chunk to the worker (feedHeld), one at a time; the worker answers every chunk on the
// caller's ack channel and sends s.done (signal) once the stream is no longer held:
// continued, answered locally, failed or aborted. Between the two the caller touches no
// field of the stream.

// DefaultBufferLimit is Options.BufferLimit's default: Envoy's default
// per_connection_buffer_limit_bytes, 1 MiB.
const DefaultBufferLimit = 1 << 20

// heldChunk is the size of one read of the request body while the headers are held, as
// bodyFilter reads it.
const heldChunk = 32 << 10

// answer sends the worker's answer to the held phase's caller. ack has room for every
// answer the caller can be owed (one per job of its in flight), so it never blocks.
func answer(ack chan bool, v bool) {
	select {
	case ack <- v:
	default:
	}
}

// heldBodyDone runs after proxy_on_request_body on a held stream: Continue (or a
// proxy_continue_stream from the callback itself) ends the hold, and the headers and the
// body buffered so far go on; anything else keeps buffering, up to Options.BufferLimit.
func (w *worker) heldBodyDone(s *stream) {
	if !s.paused || s.bodyAction == actionContinue {
		s.held, s.paused = false, false
		return
	}
	if len(s.reqBody) > w.h.opts.BufferLimit {
		s.payloadTooLarge()
	}
}

// payloadTooLarge answers the held request as Envoy's filter manager does when a buffering
// filter's request data passes the buffer limit (ActiveStreamDecoderFilter::
// requestDataTooLarge, source/common/http/filter_manager.cc): a local reply 413 "Payload Too
// Large", details request_payload_too_large — trailers-only to a gRPC request.
func (s *stream) payloadTooLarge() {
	lr := &localReply{status: http.StatusRequestEntityTooLarge, details: "request_payload_too_large",
		body: []byte("Payload Too Large"), headers: [][2]string{{"content-type", "text/plain"}}, grpcStatus: -1}
	if s.grpc {
		lr = grpcLocalReply(lr, s.head)
	}
	s.local = lr
	s.held, s.paused = false, false
	s.steps &^= requestSteps
}

// feedHeld gives a held stream the next chunk of its body (eos: the last one) and runs
// proxy_on_request_body with everything buffered so far, as Envoy's decodeData adds the chunk
// to the decoding buffer of a filter that buffers. A chunk that comes after the hold ended is
// not taken (answer false): the caller passes it on. Past Options.BufferLimit the request is
// answered 413 before the guest sees the chunk, as Envoy's watermark fires when the chunk is
// added.
func (w *worker) feedHeld(s *stream, data []byte, eos bool, ack chan bool) {
	if !s.held {
		answer(ack, false)
		return
	}
	if len(s.reqBody) > 0 && len(s.reqBody)+len(data) > w.h.opts.BufferLimit {
		s.payloadTooLarge()
	} else {
		s.reqBody = append(s.reqBody, data...)
		s.reqBodyEOS = eos
		s.steps |= stepReqBody
	}
	w.advance(s)
	answer(ack, true)
}

// pumped is one read of the request body.
type pumped struct {
	b   []byte
	err error
}

// bodyPump reads the request body on its own goroutine, one read per buffer it is given, so
// that the caller can wait for the body and for the worker at once. It ends at the end of
// the body, at a read error or when quit is closed; held.stop interrupts a read in flight.
type bodyPump struct {
	src     io.Reader
	next    chan []byte
	out     chan pumped
	quit    chan struct{}
	reading atomic.Bool // a read of src is in flight
}

func startPump(src io.Reader) *bodyPump {
	p := &bodyPump{src: src, next: make(chan []byte, 1), out: make(chan pumped, 1), quit: make(chan struct{})}
	go p.loop()
	return p
}

func (p *bodyPump) loop() {
	for {
		var buf []byte
		select {
		case buf = <-p.next:
		case <-p.quit:
			return
		}
		p.reading.Store(true)
		select {
		case <-p.quit: // stop did not see the read: it must not start
			p.reading.Store(false)
			return
		default:
		}
		n, err := p.src.Read(buf)
		p.reading.Store(false)
		if n < 0 || n > len(buf) {
			n, err = 0, io.ErrUnexpectedEOF
		}
		p.out <- pumped{buf[:n], err} // out has room: one result per buffer
		if err != nil {
			return
		}
	}
}

// errStreamEnded is what the upstream reads of a request body once its stream has ended.
var errStreamEnded = errors.New("host: the stream ended")

// heldBody is the request body after the hold: what the client sent that the filter has not
// had yet (left, then the pump's reads). It is read once, by the upstream (directly or
// through bodyFilter).
type heldBody struct {
	rw       http.ResponseWriter
	r        *http.Request
	p        *bodyPump
	buf      []byte
	left     []byte
	err      error // the end of the body (io.EOF) or the client's error, once read
	inFlight bool  // a read was asked of the pump and not taken yet
	complete bool  // the client's body was read to its end during the hold
	read     int64 // bytes read from the client during the hold
	consumed int64 // of which the filter had (read minus left)
	stopped  bool
}

func (hb *heldBody) Read(b []byte) (int, error) {
	for len(hb.left) == 0 {
		if hb.err != nil {
			return 0, hb.err
		}
		if !hb.inFlight {
			hb.p.next <- hb.buf
			hb.inFlight = true
		}
		select {
		case r := <-hb.p.out:
			hb.inFlight = false
			hb.left, hb.err = r.b, r.err
		case <-hb.p.quit:
			return 0, errStreamEnded
		}
	}
	n := copy(b, hb.left)
	hb.left = hb.left[n:]
	return n, nil
}

func (hb *heldBody) Close() error { return nil }

// answerEarly is called before the request is answered without its body (a local reply, a
// failure, 413): an HTTP/1 response sent before the end of the request body closes the
// connection, as Envoy's connection manager closes it then.
func (hb *heldBody) answerEarly() {
	if hb != nil && !hb.complete && hb.err == nil && hb.r.ProtoMajor == 1 {
		hb.rw.Header().Set("Connection", "close")
	}
}

// stop ends the pump when the request is over (after its response, so that a read error
// cannot cancel the request's context before the response is out). A read still in flight —
// the client sent no more, or the upstream stopped reading — is interrupted with a read
// deadline in the past, so neither the pump nor net/http's close of the body waits for it.
func (hb *heldBody) stop() {
	if hb == nil || hb.stopped {
		return
	}
	hb.stopped = true
	close(hb.p.quit)
	if hb.p.reading.Load() {
		http.NewResponseController(hb.rw).SetReadDeadline(time.Now())
	}
}

// runHeld runs proxy_on_request_headers for a request with a body under
// AllowOnHeadersStopIteration. If the guest holds the headers it reads the body and feeds it
// to the guest until the hold ends, and returns what is left of the body (nil when the
// headers were not held). The stream is the caller's again when it returns without an error.
func (s *stream) runHeld(ctx context.Context, rw http.ResponseWriter, r *http.Request) (*heldBody, error) {
	ack := make(chan bool, 2)
	s.steps = stepReqHeaders
	s.waiting.Store(true)
	if err := s.w.post(ctx, job{s: s}); err != nil {
		s.waiting.Store(false)
		return nil, err
	}
	// Jobs run in order: this one tells whether the headers job left the stream held.
	if err := s.w.post(ctx, job{fn: func(*worker) { answer(ack, s.held) }}); err != nil {
		s.w.postAsync(job{s: s, abort: true})
		return nil, err
	}
	select {
	case held := <-ack:
		if !held { // not paused, or paused with the body (the VM-wide stop), or continued
			select {
			case <-s.done:
				return nil, nil
			case <-ctx.Done():
				s.w.postAsync(job{s: s, abort: true})
				return nil, ctx.Err()
			case <-s.h.closed:
				return nil, ErrClosed
			}
		}
	case <-ctx.Done():
		s.w.postAsync(job{s: s, abort: true})
		return nil, ctx.Err()
	case <-s.h.closed:
		return nil, ErrClosed
	}
	hb := &heldBody{rw: rw, r: r, p: startPump(r.Body), buf: make([]byte, heldChunk)}
	hb.p.next <- hb.buf
	hb.inFlight = true
	var chunk []byte
	released, outstanding := false, false
	for !released || outstanding {
		var out chan pumped
		if hb.inFlight && !outstanding && !released {
			out = hb.p.out
		}
		select {
		case res := <-out:
			hb.inFlight = false
			hb.read += int64(len(res.b))
			if res.err != nil && res.err != io.EOF {
				// The client's body broke off: the stream is reset.
				hb.err = res.err
				hb.stop()
				s.w.postAsync(job{s: s, abort: true})
				return nil, res.err
			}
			eos := res.err == io.EOF || (r.ContentLength > 0 && hb.read >= r.ContentLength)
			if res.err == io.EOF {
				hb.err = io.EOF
			}
			if len(res.b) == 0 && !eos {
				hb.p.next <- hb.buf
				hb.inFlight = true
				continue
			}
			hb.complete = eos
			chunk = res.b
			c := chunk
			if err := s.w.post(ctx, job{fn: func(w *worker) { w.feedHeld(s, c, eos, ack) }}); err != nil {
				hb.stop()
				s.w.postAsync(job{s: s, abort: true})
				return nil, err
			}
			outstanding = true
		case consumed := <-ack:
			outstanding = false
			if !consumed {
				// The hold ended before the worker took the chunk: it goes on with the rest.
				hb.left = chunk
				continue
			}
			if !hb.complete {
				hb.p.next <- hb.buf
				hb.inFlight = true
			}
		case <-s.done:
			released = true
		case <-ctx.Done():
			hb.stop()
			s.w.postAsync(job{s: s, abort: true})
			return nil, ctx.Err()
		case <-s.h.closed:
			hb.stop()
			return nil, ErrClosed
		}
	}
	hb.consumed = hb.read - int64(len(hb.left))
	return hb, nil
}

// upstream is the request body the upstream reads after the hold, unfiltered: prefix (what
// the filter had, as it left it), then, unless the filter had the end of the body already,
// the rest as the client sends it. hb is nil when the headers were not held.
func (hb *heldBody) upstream(prefix []byte, ended bool) io.ReadCloser {
	if ended {
		return &prefixed{prefix: prefix}
	}
	return &prefixed{prefix: prefix, rest: hb}
}

// filtered is the same body when the guest filters it: the rest passes proxy_on_request_body
// chunk by chunk, as any body after the headers went on.
func (hb *heldBody) filtered(s *stream, h *Host, r *http.Request, prefix []byte, ended bool) io.ReadCloser {
	return &bodyFilter{src: hb, s: s, h: h, r: r, out: prefix, eof: ended, total: hb.consumed}
}

// fixLength keeps the upstream request's length true when the guest changed the size of the
// body it held (proxy_set_buffer_bytes): the new size if the filter had all of it, else
// unknown (chunked).
func (hb *heldBody) fixLength(out *http.Request, prefix []byte, ended bool) {
	if int64(len(prefix)) == hb.consumed || out.ContentLength <= 0 {
		return
	}
	if out == hb.r {
		return // unfiltered (fail-open): the bytes are as they came
	}
	out.ContentLength = -1
	if ended {
		out.ContentLength = int64(len(prefix))
	}
	out.Header.Del("Content-Length")
}

// prefixed reads prefix, then rest (nil: the end).
type prefixed struct {
	prefix []byte
	rest   io.Reader
}

func (p *prefixed) Read(b []byte) (int, error) {
	if len(p.prefix) > 0 {
		n := copy(b, p.prefix)
		p.prefix = p.prefix[n:]
		return n, nil
	}
	if p.rest == nil {
		return 0, io.EOF
	}
	return p.rest.Read(b)
}

func (p *prefixed) Close() error { return nil }
