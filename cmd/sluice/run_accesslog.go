package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/host"
)

// `sluice run --access-log FILE|-`: one JSON line per request, with the decision the filter
// wrote for it (its "access_log" option: proxy_set_property, which Envoy keeps as the
// filter state wasm.sluice.FIELD and the host keeps per stream). See docs/run.md.
func init() {
	runHooks = append(runHooks, runHook{flags: accessLogFlags, apply: accessLogApply})
}

// runAccessLog is --access-log of the current `sluice run` ("": none, "-": stdout).
var runAccessLog string

func accessLogFlags(fs *flag.FlagSet) {
	fs.StringVar(&runAccessLog, "access-log", "", "FILE (appended to) or - (stdout): one JSON line per request — time, method, path, status, duration and the decision the filter wrote (rule, decision, remaining, limit, key, delay_ms: the configuration's \"access_log\"); empty: none")
}

// accessLogFlushEvery is how often the access log's buffer is written out (as Envoy's
// file access log, by default).
const accessLogFlushEvery = time.Second

func accessLogApply(opts *host.Options) (func(), error) {
	if runAccessLog == "" {
		return nil, nil
	}
	var out io.WriteCloser = nopCloser{os.Stdout}
	if runAccessLog != "-" {
		f, err := os.OpenFile(runAccessLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("--access-log: %v", err)
		}
		out = f
	}
	l := newAccessLogger(out, accessLogFlushEvery)
	opts.AccessLog = l.write
	return l.close, nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// accessLogger writes the lines through a buffer, flushed every period and when closed.
type accessLogger struct {
	mu     sync.Mutex
	out    io.WriteCloser
	w      *bufio.Writer
	line   []byte
	closed bool
	stop   chan struct{}
	done   chan struct{}
}

func newAccessLogger(out io.WriteCloser, every time.Duration) *accessLogger {
	l := &accessLogger{out: out, w: bufio.NewWriterSize(out, 64<<10), stop: make(chan struct{}), done: make(chan struct{})}
	go l.flusher(every)
	return l
}

func (l *accessLogger) flusher(every time.Duration) {
	defer close(l.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.mu.Lock()
			l.w.Flush()
			l.mu.Unlock()
		}
	}
}

func (l *accessLogger) write(e host.AccessLogEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.line = appendAccessLine(l.line[:0], e)
	l.w.Write(l.line)
}

// close flushes what is buffered and closes the file; later requests are not logged.
func (l *accessLogger) close() {
	close(l.stop)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.w.Flush()
	l.out.Close()
}

// accessLineFields are the fixed fields of a line; a filter state value named
// "sluice.FIELD" is written as FIELD unless FIELD is one of them.
var accessLineFields = map[string]bool{"time": true, "method": true, "path": true, "authority": true, "protocol": true,
	"remote": true, "status": true, "bytes": true, "duration_ms": true, "details": true, "filter_state": true}

// appendAccessLine appends e's line: the fixed fields, then the filter's "sluice.*" values
// as top-level strings (as Envoy's %FILTER_STATE(wasm.sluice.FIELD:PLAIN)% gives them),
// then any other filter state under "filter_state".
func appendAccessLine(b []byte, e host.AccessLogEntry) []byte {
	b = append(b, `{"time":`...)
	b = appendJSONString(b, e.Start.UTC().Format(time.RFC3339Nano))
	for _, f := range [][2]string{{"method", e.Method}, {"path", e.Path}, {"authority", e.Authority}, {"protocol", e.Protocol}, {"remote", e.RemoteAddr}} {
		b = appendJSONField(b, f[0], f[1])
	}
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(e.Status), 10)
	b = append(b, `,"bytes":`...)
	b = strconv.AppendInt(b, e.BodyBytes, 10)
	b = append(b, `,"duration_ms":`...)
	b = strconv.AppendFloat(b, float64(e.Duration.Microseconds())/1000, 'f', -1, 64)
	if e.Details != "" {
		b = appendJSONField(b, "details", e.Details)
	}
	other := 0
	for _, fs := range e.FilterState {
		if name, ok := strings.CutPrefix(fs.Name, "sluice."); ok && name != "" && !accessLineFields[name] {
			b = appendJSONField(b, name, fs.Value)
			continue
		}
		other++
	}
	if other > 0 {
		b = append(b, `,"filter_state":{`...)
		first := true
		for _, fs := range e.FilterState {
			if name, ok := strings.CutPrefix(fs.Name, "sluice."); ok && name != "" && !accessLineFields[name] {
				continue
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = appendJSONString(b, fs.Name)
			b = append(b, ':')
			b = appendJSONString(b, fs.Value)
		}
		b = append(b, '}')
	}
	return append(b, "}\n"...)
}

func appendJSONField(b []byte, name, value string) []byte {
	b = append(b, ',')
	b = appendJSONString(b, name)
	b = append(b, ':')
	return appendJSONString(b, value)
}

// appendJSONString appends s as a JSON string (invalid UTF-8 becomes U+FFFD, as
// encoding/json writes it).
func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}
