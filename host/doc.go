// Package host is an embedded Proxy-Wasm host (ABI 0.2.1, 0.2.0 accepted) on wazero.
//
// It serves a Proxy-Wasm HTTP filter — in this project the standard-Go module built with
// GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared — without Envoy: for `sluice run`, for
// end-to-end tests, and for benchmarks of one full request cycle. Production is Envoy, Istio
// or Higress; this host reproduces the parts of their behaviour the filter depends on,
// Envoy's shared-data semantics above all.
//
// # Model
//
// New compiles the module once and starts Options.Workers workers (default runtime.NumCPU()).
// Each worker owns one VM (module instance) and one event-loop goroutine; every call into that
// VM — request callbacks, proxy_on_tick, proxy_on_http_call_response, extension callbacks —
// happens on that goroutine, so a VM is single-threaded exactly as in Envoy. Shared data
// (proxy_get_shared_data / proxy_set_shared_data) is one map for the Host's vm_id, shared by
// all workers. Metrics are process-wide (defining the same name from every worker gives one
// metric).
//
// Start-up of each VM: instantiate (WASI as the profile's cpp-host implements it, see
// Profiles; memory capped at Options.MemoryLimitPages), require an exported
// proxy_abi_version_0_2_1 or proxy_abi_version_0_2_0 function, call _initialize (or _start if
// that is what the module has), then, for each plugin, a root context:
// proxy_on_context_create(root, 0), proxy_on_vm_start(root, len(VMConfig)) and
// proxy_on_configure(root, len(config)), with the plugin's configuration as buffer type 7.
// A false return from either is an error from New that says which one.
//
// Plugins and root contexts. Plugin 0 is Options.PluginConfig; Options.MorePlugins add
// plugins of the same module in the same VMs, as Envoy does for several filter chains with
// one vm_id; each has its own root context in every VM (ids 1, 2, … at start-up; roots and
// streams share one id counter). proxy_on_vm_start runs for every new root context, as
// cpp-host's ContextBase::onStart does (src/context.cc; WasmBase::start in src/wasm.cc), not
// once per VM. A request goes through Request.Plugin (Exchange) or the plugin of its
// PluginHandler; its stream is created with that plugin's active root as parent.
// Reconfigure(ctx, plugin, config) gives the plugin a new root context on every worker
// (proxy_on_context_create, proxy_on_vm_start, proxy_on_configure); new streams get it, and
// the old root drains — it gets proxy_on_done once no live stream has it as parent, as Envoy
// keeps the old plugin until its last stream ends, then proxy_on_delete, at once or, if it
// answered false, after it calls proxy_done (see Stopping). A refusal (or trap)
// leaves the old root in force on that worker; Reconfigure tries every worker and names the
// ones that refused. A VM re-created after a trap gets, for every plugin, the configuration
// last in force on its worker. What belongs to a root is per root: tick periods
// (proxy_set_tick_period_milliseconds sets the period of the calling context's root;
// proxy_on_tick(root) runs per root on its own timer; a period set restarts that timer from
// now, and after each proxy_on_tick the next tick is due one period — the one in force after
// the callback — later, as Envoy's Wasm::setTimerPeriod recreates the timer and
// Wasm::tickHandler re-arms it; 0 stops the ticks), proxy_http_call replies and extension
// replies (Guest.RootContextID) go to the root of the context that made the call.
//
// Per request (stream): proxy_on_context_create(ctx, root), proxy_on_request_headers,
// proxy_on_request_body (only when the request has a body and the module exports it),
// then the upstream, proxy_on_response_headers, proxy_on_response_body (when exported),
// proxy_on_log, proxy_on_done, proxy_on_delete. A callback that returns Pause (1) from
// proxy_on_request_headers holds the request until the guest calls proxy_continue_stream(0)
// (or proxy_continue_request) or proxy_send_local_response from a later callback (tick, http
// call response, extension callback), or until the caller's context ends. A local response
// ends the request phase; the guest's proxy_on_response_headers is then called with the local
// response's headers (as Envoy runs encoder filters on local replies), then log/done/delete.
// Whether the request body waits with the headers is Options.AllowOnHeadersStopIteration's
// (see Pause and the request body below); by default it does, and proxy_on_request_body
// is first called after the guest continues.
// An upstream that breaks off its response mid-body resets the stream, as Envoy resets the
// downstream stream on an upstream reset: the filter gets the body bytes that came before the
// break, no end of the body, then log/done/delete (sluice run's handler recovers
// httputil.ReverseProxy's http.ErrAbortHandler for it, and re-panics so the client's
// response is broken off too; before, such a stream was never ended). The request body
// streams upstream while the response streams down, as in Envoy (the handler enables
// net/http's full duplex, and answers the end of a request body again without reading it
// again: before, net/http closed the body once the response started, the upstream
// transport's last read of it failed, and the upstream connection broke off mid-response).
//
// # Pause and the request body
//
// Options.AllowOnHeadersStopIteration (`sluice run --allow-on-headers-stop-iteration`) is
// Envoy's Wasm PluginConfig field allow_on_headers_stop_iteration (a BoolValue, Envoy ≥ 1.35,
// default false: the Context constructors in envoyproxy/envoy
// source/extensions/common/wasm/context.cc read it, DefaultAllowOnHeadersStopIteration). It
// decides what Pause (1, StopIteration) from proxy_on_request_headers means for a request
// with a body (held.go):
//
//   - false, the default: cpp-host turns it into StopAllIterationAndWatermark
//     (ContextBase::convertVmCallResultToFilterHeadersStatus, proxy-wasm-cpp-host
//     src/context.cc): neither the headers nor the body move on, and proxy_on_request_body
//     is not called until the guest calls proxy_continue_stream(0) or sends a local reply;
//     then the body is delivered to it. (Here the body is not read meanwhile; Envoy buffers
//     it, with flow control.)
//   - true: it is Envoy's Http StopIteration. The headers wait; the body is read on (up to
//     32 KiB a read, as bodyFilter reads) and each read is one proxy_on_request_body call
//     (end_of_stream on the last), with the headers still held and the upstream not called.
//     A call that returns StopIterationAndBuffer (1) keeps the data, and the next call's
//     body_buffer_length and proxy_get_buffer_bytes(HttpRequestBody) are everything buffered
//     so far plus the new chunk (Context::decodeData adds the chunk to the decoding buffer
//     while buffering_request_body_, and getBuffer returns that buffer). A call that returns
//     Continue (0) — or calls proxy_continue_stream(0) itself — resumes iteration: the headers
//     (with whatever the guest changed in them meanwhile) and every buffered byte go
//     upstream (ActiveStreamFilterBase::commonContinue, envoyproxy/envoy
//     source/common/http/filter_manager.cc), and later chunks reach proxy_on_request_body one
//     by one as after any Continue. proxy_continue_stream(0) from another callback (a tick,
//     an HTTP or gRPC call's reply, an extension's, after proxy_set_effective_context — the
//     held stream can be made effective all along) resumes the same way. A call that
//     returns StopIterationAndBuffer with end_of_stream keeps the request held until then.
//     proxy_send_local_response at any point ends the request, the body is dropped and the
//     upstream never called; over HTTP/1 a reply sent before the end of the request body
//     closes the connection after it (Connection: close), as Envoy's connection manager
//     does. A module without proxy_on_request_body resumes at the first chunk (cpp-host
//     answers Continue for it). Past Options.BufferLimit (default DefaultBufferLimit, 1 MiB,
//     Envoy's default per_connection_buffer_limit_bytes) buffered bytes, the request is
//     answered as Envoy's filter manager answers a buffering filter past its buffer limit
//     (ActiveStreamDecoderFilter::requestDataTooLarge, filter_manager.cc): a local reply 413,
//     body "Payload Too Large" (CodeUtility::toString), content-type text/plain, details
//     request_payload_too_large — before the guest sees the chunk that passes the limit, as
//     the watermark fires when decodeData adds it (a first chunk larger than the limit is
//     seen first, then answered) — and the guest's response phase sees that reply. gRPC
//     requests alike, their local replies (413 included: grpc-status 2) trailers-only. A
//     client that goes away ends the stream (proxy_on_log, proxy_on_done, proxy_on_delete);
//     the goroutine reading its body ends with it. If the guest changed the size of the
//     body it held (proxy_set_buffer_bytes), the upstream request carries the new
//     Content-Length when the guest had all of it, none (chunked) otherwise.
//
// Exchange, whose body is all there, gives it to proxy_on_request_body in one call (end of
// stream) while the headers are held, and then goes on, waits or answers as above. Requests
// without a body, and every request with the option off, take the path they took before,
// at no extra cost.
//
// Where the profiles and Envoy agree: the option is independent of Profile, as the field
// is of cpp-host's pin — Envoy 1.33 and 1.34 (inside envoy-1.33's range) do not have it
// and behave as false; 1.35 and later honour it. cpp-host's VM-wide stop flag
// (Profile.StopIterationVMWide, below) wins over it, because
// convertVmCallResultToFilterHeadersStatus checks the flag first: a stream whose
// proxy_on_request_headers sent a local reply for another stream gets
// StopAllIterationAndWatermark with the option on too, and its body waits. A body callback's
// results other than Continue — StopIterationAndWatermark, StopIterationNoBuffer, and the
// flag's conversion to StopIterationNoBuffer — buffer as StopIterationAndBuffer does here
// (as they do for any body callback in this host). Not modelled: Envoy gives
// StopIterationAndWatermark flow control instead of 413 and drops the chunk of
// StopIterationNoBuffer; its chunk boundaries are its codec's, not 32 KiB reads; Pause from
// proxy_on_response_headers still holds the response body with it whatever the option,
// where Envoy with the option on would let the response body reach proxy_on_response_body
// (cpp-host's conversion applies to both directions); and BufferLimit bounds only the body
// a guest buffers while it holds the headers — one that buffers after the headers went on
// is not bounded here, where Envoy would answer 413 too.
//
// # Profiles
//
// The host must be no kinder than the Envoy users run, or a green test proves nothing.
// Options.Profile (`sluice run --profile`) names the proxy-wasm-cpp-host behaviour set to
// reproduce (Profiles, LookupProfile); the default, DefaultProfile "envoy-1.33", is the
// strictest: cpp-host from PR #427 up to, not including, PR #533 (commit 94091cd) — the pin
// of Envoy 1.33–1.38 and so Istio 1.25–1.30. "cpphost-533" is cpp-host with #533 (Envoy ≥
// 1.39), "higress" Higress ≥ 2.1.2 (its cpp-host fork), "permissive" the earlier behaviour of
// this host (wazero's full WASI, no restrictions), for comparison only. What each models, in
// our words, and where it comes from (repository proxy-wasm/proxy-wasm-cpp-host unless said
// otherwise):
//
//   - WASI functions and their answers (wasi.go): as the wasi_unstable_* functions of
//     src/exports.cc implement them in that version, registered under both
//     "wasi_unstable" and "wasi_snapshot_preview1" (WasmBase::registerCallbacks in
//     src/wasm.cc; the list is FOR_ALL_WASI_FUNCTIONS in include/proxy-wasm/exports.h).
//     Before #533: eighteen functions; poll_oneoff answers ENOSYS (52); fd_write sends
//     stdout to the log at info and stderr at error, one record per call with the trailing
//     newline dropped, other descriptors EBADF; fd_fdstat_get answers only for 1 and 2;
//     fd_fdstat_set_flags and fd_read ENOSYS; fd_prestat_get EBADF; path_open ENOENT; no
//     environment or arguments; clock_time_get realtime and monotonic only; random_get at
//     most 64 KiB (include/proxy-wasm/limits.h). From #533: the rest of preview 1 (mostly
//     ENOTSUP/EBADF stubs, success on stdout/stderr) and poll_oneoff writes nevents = 0 and
//     succeeds without waiting. A module importing a WASI function the profile lacks fails
//     to instantiate, as cpp-host's V8 link() fails ("missing import", src/v8/v8.cc).
//     proc_exit only logs in cpp-host (wasi_unstable_proc_exit) and returns to a runtime
//     that asked to stop; here it ends the VM, which is what happens to a Go module then.
//   - Restricted callbacks (Profile.InitAllow, AllocAllow; checkAllowed in wasi.go and on
//     every env host call): while _initialize runs (WasmBase::startVm, src/wasm.cc) and
//     while proxy_on_memory_allocate runs (WasmBase::allocMemory,
//     include/proxy-wasm/wasm.h) only the allow-list may be called; V8's host-function
//     wrapper traps anything else with "restricted_callback" (src/v8/v8.cc,
//     isHostFunctionAllowed in include/proxy-wasm/wasm_vm.h). Before #533 the list inside
//     allocation is proxy_log, fd_write and clock_time_get; #533 adds poll_oneoff; Higress
//     from 2.1.2 lifts the restriction inside allocation (its fork's commit 2e96099). Stats
//     counts refused calls (RestrictedTraps) and every poll_oneoff (PollOneoffCalls).
//   - The stop-iteration flag (Profile.StopIterationVMWide; vm.stopIteration): the
//     send_local_response host call (src/exports.cc) raises one flag for the whole VM
//     (WasmBase::stopNextIteration, include/proxy-wasm/wasm.h); the stream callback running
//     at that moment has its result converted to StopAllIterationAndWatermark (headers) or
//     StopIterationNoBuffer (body) whichever stream the reply was for
//     (convertVmCallResultTo*Status, src/context.cc); the flag is cleared when the callback
//     returns (DeferAfterCallActions' destructor, src/context.cc). So a local reply for
//     stream B sent from stream A's callback leaves A paused until something continues it;
//     from proxy_on_tick or a reply callback it stops nothing. The flag wins over
//     Options.AllowOnHeadersStopIteration (see Pause and the request body).
//   - Repeated headers (headers.go): Envoy's inline headers reach the module as one entry
//     joined with "," (HeaderMapImpl::addViaMove → appendToHeader, envoyproxy/envoy
//     source/common/http/header_map_impl.cc) — authorization, user-agent, x-forwarded-for,
//     accept, content-type, … in requests; cache-control, date, etag, location, server, … in
//     responses: the sets inlineRequest and inlineResponse, as the 1.36.4 and 1.40.0 release
//     builds joined them for a probe module; cookie stays separate over HTTP/1.1 and is
//     joined with "; " over HTTP/2. Other repeats (x-api-key, set-cookie, range, forwarded,
//     …) stay separate pairs, and proxy_get_header_map_value returns the first
//     (Context::getHeaderMapValue in source/extensions/common/wasm/context.cc). Not
//     modelled: the headers Envoy strips or adds before the filters (te, connection, the
//     x-envoy-* it does not trust, x-request-id, x-forwarded-proto), the HTTP/2 cookie's
//     place at the end of the map, and the upstream seeing the joined value when the
//     filter leaves the request unchanged (net/http path).
//   - source.address is the TCP peer here: Envoy's downstream remote address with
//     use_remote_address: true. With Envoy's default (false) the connection manager takes
//     it from X-Forwarded-For instead (mutateRequestHeaders in envoyproxy/envoy
//     source/common/http/conn_manager_utility.cc) — README says why an edge must not run so.
//   - Not modelled, X-Forwarded-For before the filters: Envoy with use_remote_address: true
//     (skip_xff_append unset) appends the downstream peer to X-Forwarded-For before the
//     filters run (mutateRequestHeaders → appendXff, same file), so the module sees one more
//     entry than the client sent, and a request sent without the header reaches it with
//     one, the peer (1.40.0: a rule keyed on {"header": "x-forwarded-for"} applied to such a
//     request; e2e TestEnvoyDifferential, its diffNotModelled list). Here the module gets
//     the header as the client sent it and the peer is appended only to the upstream
//     request: `sluice run` is the edge, and client_ip.xff_trusted_hops without
//     proxy_appends_xff is written for that; appending would change which entry those
//     settings take (proxy_appends_xff: true is the setting for an Envoy that appends).
//   - Metrics: proxy_increment_metric on a counter refuses an offset ≤ 0 with BAD_ARGUMENT
//     and proxy_record_metric on a counter adds the value (Context::incrementMetric and
//     Context::recordMetric in envoyproxy/envoy source/extensions/common/wasm/context.cc;
//     checked on 1.40.0: increments of 0 and -1 answer 2, records of 5 and 1 on a counter
//     at 2 give 8). Not modelled: Envoy's gauges are unsigned (a gauge taken below 0 shows
//     2^64 minus the deficit); here they are int64.
//   - Not modelled, VM lifecycle: Envoy (1.36.4 and 1.40.0, 2 workers, a probe module
//     counting in shared data) runs _initialize, proxy_on_vm_start and proxy_on_configure
//     workers + 2 times per plugin against the real shared data before serving: a canary
//     clone (configured, then dropped without proxy_on_done or proxy_on_delete), the main
//     thread's VM (kept, serves no request) and one per worker;
//     wasm.envoy.wasm.runtime.v8.created is workers + 3, active workers + 2. This host starts
//     one VM per worker only, so a module's start-up writes to shared data happen workers
//     times, not workers + 2, and an update whose configure traps or refuses is seen by the
//     workers instead of being refused on a canary (see Traps).
//   - Not modelled, metric names: Envoy shows a guest metric as wasmcustom.<name> in /stats
//     and, in /stats/prometheus, as <name> with every character outside [a-zA-Z0-9_] turned
//     to '_' (labels inside the name included: probe.my-counter{a="b"} became
//     probe_my_counter_a__b__), an empty {} label set and # TYPE but no # HELP lines (1.40.0).
//     `sluice run`'s /metrics is its own documented format instead (see Metrics: labels kept,
//     # HELP lines, sluice_host_* families); the guest's names are unchanged there.
//   - Shared data: cas tokens come from one process-wide counter starting at 1 and skipping
//     0, not per key; a missing key is NOT_FOUND; cas 0 writes unconditionally and a nonzero
//     cas on a missing key still creates it (SharedData in src/shared_data.cc). The same in
//     every profile.
//
// # gRPC and HTTP/2
//
// Handler serves whatever protocol its http.Server speaks (`sluice run`: HTTP/1.1 and
// HTTP/2 cleartext with prior knowledge on one port) and gives the guest the same
// pseudo-headers for both (:authority, :path, :method, :scheme), request.protocol named
// as Envoy names it ("HTTP/1.1", "HTTP/2"), and a TE header reduced to "trailers" or
// removed (ConnectionManagerUtility::sanitizeTEHeader, envoyproxy/envoy
// source/common/http/conn_manager_utility.cc). Response trailers written by the upstream
// handler pass through (the guest gets no trailer callbacks). A request is gRPC when it
// arrives with a :path and content-type application/grpc or application/grpc+…
// (Grpc::Common::isGrpcRequestHeaders, source/common/grpc/common.cc); a local reply to
// it is sent as Envoy sends it (Utility::prepareLocalReply / encodeLocalReply,
// source/common/http/utility.cc): a trailers-only response — status 200,
// content-type application/grpc, grpc-status (proxy_send_local_response's grpc_status
// when it is 0..16, as Context::sendLocalResponse in
// source/extensions/common/wasm/context.cc accepts it, else the HTTP code mapped by
// Grpc::Utility::httpToGrpcStatus in source/common/grpc/status.cc; a grpc-status among
// the guest's headers wins), the body percent-encoded as grpc-message, the guest's
// other headers, no body, no content-length — and the guest's response phase sees
// those headers with end of stream. Response.GRPCStatus (Exchange) is the grpc_status
// the guest gave. The same in every profile: cpp-host passes grpc_status through
// unchanged (send_local_response, src/exports.cc), and Envoy 1.33.0's context.cc checks it
// as main's does. See grpc.go.
//
// # Upstream failures
//
// The Handler's upstream is the caller's http.Handler; UpstreamErrorHandler is an
// httputil.ReverseProxy error handler (`sluice run --upstream` uses it) that answers as
// Envoy's router answers an upstream that cannot be reached or resets before its response
// headers (Router::Filter::onUpstreamReset, source/common/router/router.cc): 503,
// content-type text/plain, "upstream connect error or disconnect/reset before headers.
// reset reason: " and the reason StreamResetReasonToString gives (source/common/http/
// utility.cc) — "remote connection failure" for a failed dial, "connection timeout",
// "connection termination" for an upstream that closes first — and, to a gRPC request, the
// same reply trailers-only (status 200, grpc-status 14 UNAVAILABLE, the text as
// grpc-message). Checked against Envoy 1.40.0 with a cluster on a closed port; Envoy 1.36.4
// appends ", transport failure reason: delayed connect error: Connection refused", which
// is not reproduced. The reply passes the guest's response phase, as Envoy's local replies
// pass the encoder filters. Not modelled: Envoy's "no healthy upstream" (its health
// checking and outlier detection), route timeouts (504 "upstream request timeout"; the
// reverse proxy has none) and retries. Each failure is logged with its cause at warning
// level, at most one line per 10 s per upstream, the next line carrying held_back=N (the
// failures not logged since); Envoy logs none at its default level and counts them in
// cluster stats instead. See upstream.go.
//
// # Stopping
//
// Close(ctx) stops the Host as Envoy lets go of a Wasm VM (proxy-wasm-cpp-host 52a0291:
// WasmHandleBase's destructor → WasmBase::startShutdown(), PluginHandleBase's →
// startShutdown(plugin_key), src/wasm.cc and include/proxy-wasm/wasm.h): new requests are
// refused at once (Exchange: ErrClosed; Handler: 503; the snapshot says closed); requests in
// flight may finish; then on every worker the streams still waiting fail (after
// proxy_on_log, proxy_on_done and proxy_on_delete) and every root context gets proxy_on_done
// (ContextBase::onDone, src/context.cc). A root that answers true (or a module without
// proxy_on_done) gets proxy_on_delete at once. One that answers false is kept, as cpp-host
// keeps it in pending_done_: its ticks go on, the replies of its calls are delivered to it,
// and it ends by calling proxy_done — exports.cc's done() → WasmBase::done, which moves the
// root to pending_delete_ and runs its onDelete after the current VM call
// (finishShutdown, via an after-VM-call action); here: proxy_on_delete once the guest call
// that called proxy_done has returned. proxy_done answers NOT_FOUND when the effective
// context's root is not waiting for it. The same holds for a root retired by Reconfigure.
// A deleted root's proxy_http_call and proxy_grpc_call calls in flight are cancelled, as
// Envoy's Context destructor cancels a context's outstanding HTTP and gRPC requests
// (Context::~Context, envoyproxy/envoy source/extensions/common/wasm/context.cc); extension
// calls registered with Guest.Start (the Redis calls) are not cancelled — a command already
// sent is not unsent — and Close waits for them, their replies dropped when their root is
// gone, so what a root sends from proxy_on_done reaches its server. Close returns when no
// worker has a root or a call in flight left, or at ctx's deadline (DefaultCloseTimeout
// without one): then the roots still waiting get proxy_on_delete and calls still in flight
// are abandoned. Envoy itself bounds none of this: at server shutdown it holds its
// ShutdownExit stage until the Wasm is destroyed (Wasm::initializeLifecycle and ~Wasm in
// source/extensions/common/wasm/wasm.cc), and what bounds it is the process manager's
// grace period, which is the deadline's role here (`sluice run --drain-timeout`).
//
// Not modelled, and kinder than Envoy: what a root sends from proxy_on_done when the whole
// proxy stops. Real Envoy (1.36.4 and 1.40.0, e2e TestEnvoyRLSLeaseStop, trace log) runs a
// worker's root contexts' proxy_on_done only after that worker has left its event loop
// (WorkerImpl::threadRoutine: the dispatcher's run, then the thread-local slots' shutdown):
// proxy_grpc_call still answers OK, the root answers false, and the VM is destroyed at once,
// its call cancelled with no loop left to send it — the bytes got out in 4 runs of 10. So a
// bare SIGTERM to Envoy may lose what proxy_on_done returns (a lease's unspent admissions:
// lost as if spent, never duplicated); a proxy that drains first (Istio's
// terminationDrainDuration, a preStop hook) has returned idle pools on its tick. Close keeps
// the loop running until those calls are answered because `sluice run` is itself a proxy
// users run, where losing the return would be a defect; a configuration replaced while the
// proxy runs (the old root drained, its loop live) behaves the same in both.
//
// # Traps
//
// A guest call that fails (unreachable, Go panic → proc_exit, out of memory at the memory cap,
// a panic inside a host call, or — with Options.CallTimeout — a call that runs too long)
// fails that VM. What follows is Envoy's failure_policy (Options.FailurePolicy, `sluice run
// --failure-policy`; PluginConfig::createContext and maybeReloadHandleIfNeeded in
// envoyproxy/envoy source/extensions/common/wasm/wasm.cc, CHECK_FAIL_HTTP in cpp-host
// src/context.cc), checked against the 1.36.4 and 1.40.0 release builds with
// testdata/guests/trapper:
//
//   - The request whose callback trapped gets Envoy's failure reply (Context::failStream,
//     source/extensions/common/wasm/context.cc): 503, no body (content-length: 0), details
//     wasm_fail_stream; a gRPC request gets it as a trailers-only response with
//     grpc-status 14 (UNAVAILABLE) and no grpc-message. A trap in the response phase replaces
//     the upstream's response with it while the headers are not out yet, else cuts the body
//     short. The other streams of that VM get it too (paused ones at once, the others at
//     their next phase; a trap in proxy_on_log/done/delete leaves the response alone). With
//     Options.FailOpen — Envoy's legacy fail_open: true, which cpp-host reads as fail_open_ —
//     these go on to the upstream unfiltered instead.
//   - FailClosed, the zero value, is Envoy's default: failure_policy unset and fail_open
//     false. (The design notes said FAIL_RELOAD since 1.33; both release builds keep a
//     failed VM — wasm.<plugin>.vm_reload_* stay 0 — and 1.36.4 logs the runtime guard
//     envoy.reloadable_features.wasm_failure_reload_by_default as removed.) The worker keeps
//     no VM; every later request on it gets the failure reply until the Host is recreated.
//   - FailReload: the first request that comes at least the backoff after the worker's last
//     load — its start or its last reload attempt, not the failure — loads a fresh VM
//     (_initialize, every plugin's root with the configuration in force on that worker) and
//     is served by it; the requests before get the failure reply and are counted in
//     Stats.ReloadBackoffs (Envoy's vm_reload_backoff). The backoff is drawn for every
//     request at random in [ReloadBackoff, 1.5×ReloadBackoff), Envoy's
//     JitteredLowerBoundBackOffStrategy (source/common/common/backoff_strategy.cc) over
//     reload_config.backoff.base_interval, default 1 s. So a trap long after the last load is
//     followed by an immediate reload, and a second trap soon after it by 1–1.5 s of 503s
//     (as observed). Stats counts reloads as VMRestarts.
//   - FailOpen: later requests on the worker skip the filter (Envoy creates no filter for
//     them) and go to the upstream unfiltered; Response.Failed is set.
//
// A Reconfigure whose proxy_on_configure traps replaces that worker's VM at once, whatever
// the policy: Envoy would have configured the update on its canary VM first and refused it
// there (see VM lifecycle). Not modelled: whether a configuration update gives a failed
// worker a fresh VM in Envoy (here it does not; the worker keeps its policy). The Host itself
// never panics because of a guest; /healthz reports a worker without a VM.
//
// A body callback that returns Pause buffers: the next callback sees the accumulated body,
// and the data is released on Continue or at the end of the body. Pause from
// proxy_on_response_headers waits for proxy_continue_stream(1) like the request side.
//
// # Host calls
//
// Implemented with Envoy's semantics: proxy_log, proxy_get_log_level, header maps (types 0–3
// and 6–7: get/add/replace/remove/get_pairs/set_pairs/get_size; keys are stored lower-case;
// serialization: u32 count, then u32 key size and u32 value size per pair, then each key and
// value followed by NUL, little-endian), proxy_get_buffer_bytes / proxy_set_buffer_bytes /
// proxy_get_buffer_status (request/response body, http call response body, VM and plugin
// configuration), proxy_send_local_response, proxy_get_property (path segments separated by
// NUL; see Properties below), proxy_set_property (the stream's filter state, see
// Properties), proxy_continue_stream / proxy_continue_request /
// proxy_continue_response, proxy_set_effective_context, proxy_set_tick_period_milliseconds,
// proxy_define_metric / proxy_increment_metric / proxy_record_metric / proxy_get_metric,
// proxy_http_call, proxy_grpc_call / proxy_grpc_cancel / proxy_grpc_close (see gRPC calls),
// proxy_get_current_time_nanoseconds, proxy_get_shared_data /
// proxy_set_shared_data, proxy_done (see Stopping). proxy_set_effective_context accepts any live root context (active
// or draining) and the streams the worker owns at that moment (paused, or the one being
// processed). Buffers returned to the guest are allocated with its exported
// proxy_on_memory_allocate; an empty result is returned as pointer 0, size 0 without calling it.
// Every other function the module imports from "env" is linked to a stub that logs once per
// name and returns UNIMPLEMENTED (12); Options.Extensions can add more host calls (see
// Extension) — that is where the Redis calls of Higress go.
//
// Shared data: get on a missing key → NOT_FOUND; get returns (value, cas); set with cas 0 is
// unconditional; set with a nonzero cas on an existing key whose cas differs → CAS_MISMATCH;
// the cas is ignored when the key does not exist (two workers creating a key both succeed,
// last write wins). Every successful set gives the key a new cas (a process-wide counter,
// never 0). No delete, no TTL, no listing — like Envoy.
//
// Properties: source.address ("ip:port" of the TCP peer), source.port (int64 LE),
// destination.address, destination.port, request.path (with query), request.url_path,
// request.method, request.host, request.scheme, request.protocol, request.id,
// request.headers (serialized like a header map), response.code (int64 LE, response phase),
// plugin_name, plugin_root_id, plugin_vm_id, xds.route_name and xds.cluster_name (the
// request's Route, Options.Routes or Request.RouteName; NOT_FOUND without one). route_name
// and cluster_name only in profiles with LegacyWasmAttributes (higress, permissive): upstream
// Envoy removed these Wasm-specific names in 1.33 in favour of xds.* (changelogs/1.33.0.yaml,
// PR #36619), Higress's Envoy keeps them (higress-group/envoy,
// source/extensions/common/wasm/context.cc, Context::findValue).
// metadata.filter_metadata.<namespace>.<field>... from the stream's Metadata (Request.Metadata,
// or WithMetadata on the request's context), encoded as Envoy's serializeValue
// (context.cc): strings as is, numbers as 8-byte little-endian doubles, booleans as one byte,
// structures as pairs, lists as pairs of their elements with empty values.
// A path of one segment that the stream set with proxy_set_property is its value (Envoy's
// filter state "wasm." + path; filterstate.go). Anything else → NOT_FOUND.
//
// HTTP calls: proxy_http_call(cluster, headers, body, trailers, timeout) sends the request to
// Options.Clusters[cluster] (a base URL; :path is appended); :method, :path and :authority
// are required (BAD_ARGUMENT otherwise, and for an unknown cluster). As in Envoy the call
// belongs to a root context, the root of the calling context: the reply is delivered on the
// calling VM's worker as proxy_on_http_call_response(root_context_id, id, headers, body
// size, trailers), with that root as the effective context; the guest makes the calling
// stream effective with proxy_set_effective_context (BAD_ARGUMENT if that stream has ended
// meanwhile). A failure or timeout is delivered with 0 headers and an empty body, like
// Envoy; a reply for a root that has been deleted meanwhile is dropped.
//
// gRPC calls (grpccall.go): proxy_grpc_call(service, service_name, method,
// initial_metadata, message, timeout) as Envoy serves it (Context::grpcCall in
// source/extensions/common/wasm/context.cc, envoyproxy/envoy main 6806efb, read from the
// botengyao/envoy fork; cpp-host src/exports.cc grpc_call and include/proxy-wasm/wasm.h,
// proxy-wasm-cpp-host 52a0291). The service argument is a serialized
// envoy.config.core.v3.GrpcService if it parses as one (its envoy_grpc.cluster_name; a
// google_grpc target → BAD_ARGUMENT here, where Envoy would build a Google gRPC client),
// else a cluster name: Options.Clusters[name] (`sluice run --cluster NAME=http://HOST:PORT`,
// reached over HTTP/2 cleartext; https:// uses TLS), PARSE_FAILURE for a name the host does
// not know (Envoy: no thread-local cluster). The call belongs to the root of the effective
// context (cpp-host calls grpcCall on root_context()); tokens are cpp-host's call ids, 1 +
// 4n per VM (the low two bits 01 say "gRPC call"). The message goes out as is (grpc-go,
// one ClientConn per cluster, a raw codec) with the initial metadata (pseudo-headers
// dropped) and the timeout (0: none). The outcome arrives on the calling VM's worker with
// that root as the effective context: proxy_on_grpc_receive(root, token, size), the reply
// readable as buffer 5 (GrpcReceiveBuffer) during the callback, or proxy_on_grpc_close(root,
// token, status) with the non-OK gRPC status (DEADLINE_EXCEEDED on timeout, UNAVAILABLE when
// the cluster does not answer) — never both, and no
// proxy_on_grpc_receive_initial_metadata / _trailing_metadata for a unary call: Envoy's
// GrpcCallClientHandler has only onSuccessRaw (→ onGrpcReceiveWrapper) and onFailure (→
// onGrpcCloseWrapper). proxy_grpc_cancel and proxy_grpc_close abandon a call (no callback
// follows): OK, NOT_FOUND for a call id not in flight and for any stream id, BAD_ARGUMENT
// for other ids (Context::grpcCancel / grpcClose). Streams are not implemented:
// proxy_grpc_stream → UNIMPLEMENTED (cpp-host's ContextBase answer), proxy_grpc_send →
// BAD_ARGUMENT for a non-stream id (as Envoy), NOT_FOUND otherwise. proxy_get_status (the
// close message) is not implemented. A reply for a root deleted meanwhile is dropped;
// the calls of a deleted root are cancelled (see Stopping).
//
// # Time
//
// The host runs on one clock, Options.Clock (Clock; the wall clock, WallClock, by default):
// WASI clock_time_get (realtime: the clock's time; monotonic: the time since the host
// started on it, plus 1) and proxy_get_current_time_nanoseconds, which is what the guest
// reads — the sluice filter reads the realtime clock —; wazero's own WASI under the wazero
// profile; when proxy_on_tick is due on each root (the worker's timer is the clock's);
// FailReload's backoff since the worker's last load; the timeouts of proxy_http_call and
// proxy_grpc_call (on another clock than the wall clock a gRPC call carries no deadline to
// the server, and its timeout passing is reported as DEADLINE_EXCEEDED all the same);
// Options.CallTimeout's watchdog; Stats.Uptime. Tests give a clock they step
// (host/fakeclock): time passes when they step it, never while they wait, and the filter
// inside the guest sees the stepped time. On the wall clock always, because they measure
// or bound the host's own work rather than the time the guest lives in: the durations of
// the start-up phases in the debug log, the second Close waits past its deadline for a
// worker stuck in a guest call and the 5 s a stopping worker is waited for, Close's
// deadline (its ctx, DefaultCloseTimeout), net/http read deadlines, and the Redis
// extension's timeouts (its client's network I/O).
//
// # Go API
//
//	h, err := host.New(ctx, host.Options{Wasm: wasmBytes, PluginConfig: cfg, Workers: 4})
//	defer h.Close(ctx)
//	srv := &http.Server{Handler: h.Handler(upstream)}    // net/http path (streams bodies)
//	h.PluginHandler(1, upstream)                         // the same for plugin 1 (MorePlugins[0])
//	resp, err := h.Exchange(ctx, &host.Request{...}, up) // plain structs, for tests/benchmarks
//	err = h.Reconfigure(ctx, plugin, newConfig)          // a configuration reload
//	h.SharedData().Get(key) / Set(key, v, cas) / Len() / Bytes() / Keys()
//	h.Stats()                     // per-worker memory, restarts, requests, failed requests
//	h.Metrics(), h.Metric(name)   // the guest's metrics (process-wide, by name)
//	snap := h.Snapshot()          // stats, metrics, configurations in force, closed: Go values
//	snap.WritePrometheus(w)       // guest + host metrics, Prometheus text format
//	snap.Status()                 // the /status document
//	h.AdminHandler()              // /metrics, /status (JSON), /healthz, each from a Snapshot
//	h.Tick(ctx)                   // run proxy_on_tick now for every root that has a period set
//	host.Options{Clock: c}        // the clock the host and the guest run on (see Time)
//	h.Close(ctx)                  // stop as Envoy does: proxy_on_done, proxy_done, bounded by ctx
//	h.Kill()                      // stop as a killed proxy: no proxy_on_done (tests of crashes)
//
// Exchange sends the request through one worker in a single hand-off: request phase, then
// upstream(req) on the worker goroutine with the request as the filter left it (so the
// upstream func must be quick and must not block or call t.Fatal; nil: an empty 200), then
// the response phase, then log/done/delete, all before Exchange returns. Handler runs the
// upstream on the request's goroutine instead, and hands off to the worker once per phase.
// A Host is safe for concurrent use by many goroutines.
//
// # Metrics
//
// Guest metric names become Prometheus names (Metric.Family, Metric.Labels): a name of the
// form base{label="v",...} keeps its labels (values escaped as in the Prometheus text
// format: \\, \" and \n; label names sanitised; a label set that does not parse, or has
// a label named "le" on a histogram, a repeated name or a reserved "__" one, is part of
// the name instead); every other character outside [a-zA-Z0-9_:], and a leading digit,
// becomes '_' (Envoy-style "a.b.c" becomes "a_b_c"). WritePrometheus gives every family
// one # HELP line (Options.MetricHelp, or the metric's type and name) and one # TYPE line
// followed by all its samples, and escapes label values. Two guest metrics cannot share a
// series or a family name with different types: the first by guest name is exposed, the
// other left out (counted in sluice_host_metrics_unexposed, named in /status). The host
// adds sluice_host_workers, sluice_host_requests_total, sluice_host_vm_restarts_total,
// sluice_host_failed_requests_total, sluice_host_worker_memory_bytes{worker},
// sluice_host_worker_healthy{worker}, sluice_host_shared_data_keys,
// sluice_host_shared_data_bytes, sluice_host_uptime_seconds and
// sluice_host_metrics_unexposed.
//
// # Extensions
//
// Options.Extensions add host calls (Extension, HostFunc). A HostFunc runs on the worker
// inside the guest's call and sees the calling VM as a *Guest: memory access, ReturnBytes
// (allocates in the guest like every built-in call), the effective context id and its root
// context's id (RootContextID: where a call's reply belongs), Post (hand
// work back to this VM's worker from any goroutine), Start (register a call in flight and
// get the function that delivers its outcome: Close waits for it) and, inside a Post
// callback, Callback
// (call a guest export for a context, with extra buffer types readable through
// proxy_get_buffer_bytes, e.g. type 9 for a Redis reply). A request paused in
// on_request_headers resumes when the callback calls proxy_continue_stream.
package host
