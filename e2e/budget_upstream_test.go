package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// A fake OpenAI- and Anthropic-compatible upstream for the token-budget tests
// (budget_test.go), on 127.0.0.1. POST …/chat/completions answers an OpenAI Chat
// Completion, POST …/messages an Anthropic Message: a JSON body, or when the request's
// JSON body says "stream":true (or x-test-mode: sse) a text/event-stream of several
// events, each flushed on its own, the usage in the last (then data: [DONE] for
// OpenAI, message_stop for Anthropic). The request headers choose the rest:
//
//	x-test-usage: N  the total tokens the response reports (default 100); OpenAI's
//	                 prompt_tokens is N/4, completion_tokens the rest; the response
//	                 header x-usage carries N too
//	x-test-id: S     the body sent is kept under S (llmUpstream.sent)
//	x-test-gate: G   the handler waits for release(G) before answering (JSON) or after
//	                 the first two events (a stream)
//	x-test-mode: M   a hostile answer instead: see llmUpstream.hostile
//
// It counts the requests it receives by x-api-key.
type llmUpstream struct {
	port int

	mu    sync.Mutex
	count map[string]int
	sent  map[string][]byte
	got   map[string][]byte // the request bodies received, by x-test-id
	gates map[string]chan struct{}
	held  map[string]int // requests waiting at a gate, by x-api-key
}

func startLLMUpstream(t *testing.T) *llmUpstream {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &llmUpstream{
		port:  l.Addr().(*net.TCPAddr).Port,
		count: map[string]int{},
		sent:  map[string][]byte{},
		got:   map[string][]byte{},
		gates: map[string]chan struct{}{},
		held:  map[string]int{},
	}
	srv := &http.Server{Handler: http.HandlerFunc(u.serve)}
	go srv.Serve(l)
	t.Cleanup(func() {
		u.mu.Lock()
		for name, g := range u.gates {
			select {
			case <-g:
			default:
				close(g)
			}
			delete(u.gates, name)
		}
		u.mu.Unlock()
		srv.Close()
	})
	return u
}

// requests is how many requests of the key reached the upstream.
func (u *llmUpstream) requests(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.count[key]
}

// waiting is how many requests of the key wait at a gate.
func (u *llmUpstream) waiting(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.held[key]
}

// body is what the upstream sent for x-test-id id (nil before it finished).
func (u *llmUpstream) body(id string) []byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.sent[id]
}

// received is the request body the upstream got for x-test-id id (nil: none came).
func (u *llmUpstream) received(id string) []byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.got[id]
}

func (u *llmUpstream) gate(name string) chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	g, ok := u.gates[name]
	if !ok {
		g = make(chan struct{})
		u.gates[name] = g
	}
	return g
}

// release opens gate name: the requests waiting at it go on, later ones do not wait.
func (u *llmUpstream) release(name string) {
	g := u.gate(name)
	u.mu.Lock()
	defer u.mu.Unlock()
	select {
	case <-g:
	default:
		close(g)
	}
}

// wait waits at the request's gate, if it names one (bounded: a test that forgets to
// release it must not hang).
func (u *llmUpstream) wait(r *http.Request) {
	name := r.Header.Get("X-Test-Gate")
	if name == "" {
		return
	}
	key := r.Header.Get("X-Api-Key")
	u.mu.Lock()
	u.held[key]++
	u.mu.Unlock()
	select {
	case <-u.gate(name):
	case <-time.After(20 * time.Second):
	case <-r.Context().Done():
	}
	u.mu.Lock()
	u.held[key]--
	u.mu.Unlock()
}

// recorder keeps what the handler writes, flushing after each event.
type recorder struct {
	w   http.ResponseWriter
	buf bytes.Buffer
}

func (rc *recorder) write(s string) {
	rc.buf.WriteString(s)
	io.WriteString(rc.w, s)
}

func (rc *recorder) flush() {
	if f, ok := rc.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (u *llmUpstream) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("X-Api-Key")
	u.mu.Lock()
	u.count[key]++
	u.mu.Unlock()
	reqBody, _ := io.ReadAll(r.Body)
	if id := r.Header.Get("X-Test-Id"); id != "" {
		u.mu.Lock()
		u.got[id] = reqBody
		u.mu.Unlock()
	}
	var req struct {
		Stream bool `json:"stream"`
	}
	json.Unmarshal(reqBody, &req)
	total := int64(100)
	if v := r.Header.Get("X-Test-Usage"); v != "" {
		total, _ = strconv.ParseInt(v, 10, 64)
	}
	mode := r.Header.Get("X-Test-Mode")
	if mode == "" && req.Stream {
		mode = "sse"
	}
	rc := &recorder{w: w}
	defer func() {
		if id := r.Header.Get("X-Test-Id"); id != "" {
			u.mu.Lock()
			u.sent[id] = append([]byte(nil), rc.buf.Bytes()...)
			u.mu.Unlock()
		}
	}()
	switch {
	case strings.HasSuffix(r.URL.Path, "/messages"):
		u.anthropic(rc, r, mode, total)
	case strings.HasSuffix(r.URL.Path, "/chat/completions"):
		u.openai(rc, r, mode, total)
	default:
		http.NotFound(w, r)
	}
}

func openaiUsage(total int64) string {
	p := total / 4
	return fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, p, total-p, total)
}

func openaiJSON(usage string) string {
	return `{"id":"chatcmpl-e2e","object":"chat.completion","created":1700000000,"model":"e2e-model",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello from the budget upstream."},"finish_reason":"stop"}],` +
		`"usage":` + usage + `}`
}

func openaiChunk(i int, content string) string {
	return fmt.Sprintf(`data: {"id":"chatcmpl-e2e","object":"chat.completion.chunk","created":1700000000,"model":"e2e-model",`+
		`"choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}],"usage":null}`+"\n\n", fmt.Sprintf("%s %d", content, i))
}

func openaiUsageChunk(usage string) string {
	return `data: {"id":"chatcmpl-e2e","object":"chat.completion.chunk","created":1700000000,"model":"e2e-model","choices":[],"usage":` + usage + "}\n\n"
}

// The hostile modes (x-test-mode), OpenAI:
//
//	sse-nousage  a stream of chunks and data: [DONE], no usage anywhere
//	reset-early  two chunks, then the connection is cut (no usage)
//	reset-late   two chunks and the usage chunk, then the connection is cut
//	nonjson      Content-Type application/json, an HTML body
//	string       "total_tokens":"N"
//	negative     "total_tokens":-N
//	overflow     "total_tokens" with 30 digits (beyond int64)
//	maxint       "total_tokens":9223372036854775807 (valid, but beyond any budget)
//	gzip         the JSON gzip-compressed (Content-Encoding: gzip)
//	error        500 with an OpenAI error body, no usage
//	huge         a valid JSON body of 20 MiB of content, the usage at its end
//	bigline      a stream whose second event is one 2 MiB data line, then the usage
func (u *llmUpstream) openai(rc *recorder, r *http.Request, mode string, total int64) {
	w := rc.w
	usage := openaiUsage(total)
	switch mode {
	case "sse", "sse-nousage", "reset-early", "reset-late", "bigline":
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(200)
		for i := 0; i < 2; i++ {
			rc.write(openaiChunk(i, "token"))
			rc.flush()
		}
		u.wait(r)
		switch mode {
		case "reset-early":
			panic(http.ErrAbortHandler)
		case "bigline":
			rc.write("data: {\"filler\":\"" + strings.Repeat("x", 2<<20) + "\"}\n\n")
			rc.flush()
		}
		for i := 2; i < 5; i++ {
			rc.write(openaiChunk(i, "token"))
			rc.flush()
		}
		if mode != "sse-nousage" {
			rc.write(openaiUsageChunk(usage))
			rc.flush()
		}
		if mode == "reset-late" {
			panic(http.ErrAbortHandler)
		}
		rc.write("data: [DONE]\n\n")
		rc.flush()
		return
	}
	u.wait(r)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Usage", strconv.FormatInt(total, 10))
	switch mode {
	case "":
		rc.write(openaiJSON(usage))
	case "nonjson":
		rc.write("<html><body>502 Bad Gateway (but not really)</body></html>\n")
	case "string":
		rc.write(openaiJSON(fmt.Sprintf(`{"prompt_tokens":"1","completion_tokens":"2","total_tokens":"%d"}`, total)))
	case "negative":
		rc.write(openaiJSON(fmt.Sprintf(`{"prompt_tokens":-1,"completion_tokens":-2,"total_tokens":-%d}`, total)))
	case "overflow":
		rc.write(openaiJSON(`{"prompt_tokens":1,"completion_tokens":2,"total_tokens":123456789012345678901234567890}`))
	case "maxint":
		rc.write(openaiJSON(`{"prompt_tokens":1,"completion_tokens":2,"total_tokens":9223372036854775807}`))
	case "gzip":
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		io.WriteString(zw, openaiJSON(usage))
		zw.Close()
		w.Header().Set("Content-Encoding", "gzip")
		rc.write(b.String())
	case "error":
		w.WriteHeader(500)
		rc.write(`{"error":{"message":"the model is overloaded","type":"server_error","code":null}}`)
	case "huge":
		// 20 MiB of content in 64 KiB writes, the usage at the end.
		rc.write(`{"id":"chatcmpl-e2e","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"`)
		piece := strings.Repeat("abcdefghijklmnop", 4<<10)
		for i := 0; i < 20<<20/len(piece); i++ {
			rc.write(piece)
		}
		rc.write(`"},"finish_reason":"length"}],"usage":` + usage + `}`)
	default:
		w.WriteHeader(400)
		rc.write("unknown x-test-mode " + mode)
	}
}

// anthropic answers a Message: with input_tokens N/4, cache_read_input_tokens 10,
// cache_creation_input_tokens 5, and output_tokens the rest of N (so the cost, all
// four weighted 1, is N+15); a stream reports output_tokens 1 in message_start and the
// final count in message_delta (Anthropic's counts are cumulative).
func (u *llmUpstream) anthropic(rc *recorder, r *http.Request, mode string, total int64) {
	w := rc.w
	in := total / 4
	out := total - in
	if mode == "sse" {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		ev := func(typ, data string) {
			rc.write("event: " + typ + "\ndata: " + data + "\n\n")
			rc.flush()
		}
		ev("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_e2e","type":"message","role":"assistant","content":[],"model":"e2e-claude","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":%d,"cache_creation_input_tokens":5,"cache_read_input_tokens":10,"output_tokens":1}}}`, in))
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
		u.wait(r)
		ev("ping", `{"type": "ping"}`)
		for i := 0; i < 3; i++ {
			ev("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"word %d "}}`, i))
		}
		ev("content_block_stop", `{"type":"content_block_stop","index":0}`)
		ev("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":%d}}`, out))
		ev("message_stop", `{"type":"message_stop"}`)
		return
	}
	u.wait(r)
	w.Header().Set("Content-Type", "application/json")
	rc.write(fmt.Sprintf(`{"id":"msg_e2e","type":"message","role":"assistant","content":[{"type":"text","text":"Hi."}],"model":"e2e-claude","stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":%d,"cache_creation_input_tokens":5,"cache_read_input_tokens":10,"output_tokens":%d}}`, in, out))
}
