package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"

	"google.golang.org/grpc/grpclog"
)

// `sluice run` logs in one format on one stream: slog's text format (time=… level=… msg=…)
// on stderr — the host's events, the filter's proxy_log lines (Proxy-Wasm's critical level
// named CRITICAL), and what the Go libraries underneath report (net/http, the standard log
// package, gRPC, go-redis). Stdout carries only the start-up lines that say what serves
// where; a reason not to start is the command's error, its last words on stderr.

// levelCritical is Proxy-Wasm's critical level as the host logs it (host.Options.LogLevel).
const levelCritical = slog.LevelError + 4

// newRunLogger is the log of `sluice run`: text records on w from level on.
func newRunLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if a.Key == slog.LevelKey && len(groups) == 0 {
			if l, ok := a.Value.Any().(slog.Level); ok && l >= levelCritical {
				a.Value = slog.StringValue("CRITICAL")
			}
		}
		return a
	}}))
}

// useProcessLogger makes logger the process's: slog's default (and with it the standard
// log package's output) and gRPC's, whose own format would otherwise reach stderr. Only
// runRun calls it, once, before anything runs (gRPC's logger must not change later).
func useProcessLogger(logger *slog.Logger) {
	slog.SetDefault(logger)
	grpclog.SetLoggerV2(grpcLogger{logger})
}

// grpcLogger is grpclog.LoggerV2 on slog: gRPC's info at debug level (it is chatty), its
// warnings and errors as such.
type grpcLogger struct{ l *slog.Logger }

func (g grpcLogger) log(level slog.Level, msg string) {
	g.l.Log(context.Background(), level, "grpc: "+msg)
}
func (g grpcLogger) Info(args ...any)   { g.log(slog.LevelDebug, fmt.Sprint(args...)) }
func (g grpcLogger) Infoln(args ...any) { g.log(slog.LevelDebug, fmt.Sprint(args...)) }
func (g grpcLogger) Infof(format string, args ...any) {
	g.log(slog.LevelDebug, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Warning(args ...any)   { g.log(slog.LevelWarn, fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any) { g.log(slog.LevelWarn, fmt.Sprint(args...)) }
func (g grpcLogger) Warningf(format string, args ...any) {
	g.log(slog.LevelWarn, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Error(args ...any)   { g.log(slog.LevelError, fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any) { g.log(slog.LevelError, fmt.Sprint(args...)) }
func (g grpcLogger) Errorf(format string, args ...any) {
	g.log(slog.LevelError, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Fatal(args ...any)                 { g.fatal(fmt.Sprint(args...)) }
func (g grpcLogger) Fatalln(args ...any)               { g.fatal(fmt.Sprint(args...)) }
func (g grpcLogger) Fatalf(format string, args ...any) { g.fatal(fmt.Sprintf(format, args...)) }
func (g grpcLogger) V(l int) bool {
	return l <= 0 && g.l.Enabled(context.Background(), slog.LevelDebug)
}

// fatal logs and exits, as grpclog.LoggerV2's Fatal must.
func (g grpcLogger) fatal(msg string) {
	g.log(levelCritical, msg)
	os.Exit(1)
}

// holdHandler passes records to inner, or, while its state holds, keeps them (with the
// handler derived for them) until release.
type holdHandler struct {
	inner slog.Handler
	st    *holdState
}

type holdState struct {
	mu      sync.Mutex
	holding bool
	held    []heldRecord
}

type heldRecord struct {
	h slog.Handler
	r slog.Record
}

func (h holdHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h holdHandler) Handle(ctx context.Context, r slog.Record) error {
	h.st.mu.Lock()
	if h.st.holding {
		h.st.held = append(h.st.held, heldRecord{h.inner, r.Clone()})
		h.st.mu.Unlock()
		return nil
	}
	h.st.mu.Unlock()
	return h.inner.Handle(ctx, r)
}

func (h holdHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return holdHandler{h.inner.WithAttrs(as), h.st}
}

func (h holdHandler) WithGroup(name string) slog.Handler {
	return holdHandler{h.inner.WithGroup(name), h.st}
}

// release writes the held records in order, except those drop says to drop, and stops
// holding. Later calls do nothing.
func (st *holdState) release(drop func(slog.Record) bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.holding {
		return
	}
	for _, hr := range st.held {
		if drop == nil || !drop(hr.r) {
			hr.h.Handle(context.Background(), hr.r)
		}
	}
	st.held, st.holding = nil, false
}
