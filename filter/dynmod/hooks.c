// The hooks Envoy calls (envoy_dynamic_module_on_*). Each enters Go only when Go has work:
// a stream's request headers always, its later hooks only while the VM holds it (SL_LIVE).
// An admitted request that the VM ended at its headers costs one entry into the Go runtime;
// its response headers are added here, from what Go prepared.
//
// Envoy resolves 21 hooks when it loads an HTTP filter configuration: every one is defined,
// those sluice does not use (callouts, streams, watermarks) as no-ops.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envoy_abi.h"
#include "_cgo_export.h"

// The ABI version Envoy 1.40 expects; 1.38 and 1.39 (v0.1.0, which v0.2.0 is compatible with)
// log a warning and load the module.
static const char sl_abi_version[] = "v0.2.0";

// sl_missing_callback names the first callback this Envoy does not provide, or NULL.
const char* sl_missing_callback(void) {
#define SL_NEED(f) if (!(f)) return #f;
  SL_NEED(envoy_dynamic_module_callback_log)
  SL_NEED(envoy_dynamic_module_callback_get_concurrency)
  SL_NEED(envoy_dynamic_module_callback_http_get_header)
  SL_NEED(envoy_dynamic_module_callback_http_get_headers_size)
  SL_NEED(envoy_dynamic_module_callback_http_get_headers)
  SL_NEED(envoy_dynamic_module_callback_http_add_header)
  SL_NEED(envoy_dynamic_module_callback_http_send_response)
  SL_NEED(envoy_dynamic_module_callback_http_filter_continue_decoding)
  SL_NEED(envoy_dynamic_module_callback_http_filter_scheduler_new)
  SL_NEED(envoy_dynamic_module_callback_http_filter_scheduler_commit)
  SL_NEED(envoy_dynamic_module_callback_http_filter_scheduler_delete)
  SL_NEED(envoy_dynamic_module_callback_http_get_body_size)
  SL_NEED(envoy_dynamic_module_callback_http_get_body_chunks_size)
  SL_NEED(envoy_dynamic_module_callback_http_get_body_chunks)
  SL_NEED(envoy_dynamic_module_callback_http_received_buffered_request_body)
  SL_NEED(envoy_dynamic_module_callback_http_received_buffered_response_body)
  SL_NEED(envoy_dynamic_module_callback_http_filter_get_attribute_string)
  SL_NEED(envoy_dynamic_module_callback_http_get_cluster_name)
  SL_NEED(envoy_dynamic_module_callback_http_filter_get_worker_index)
  SL_NEED(envoy_dynamic_module_callback_http_filter_config_define_counter)
  SL_NEED(envoy_dynamic_module_callback_http_filter_config_define_gauge)
  SL_NEED(envoy_dynamic_module_callback_http_filter_config_define_histogram)
  SL_NEED(envoy_dynamic_module_callback_http_filter_increment_counter)
  SL_NEED(envoy_dynamic_module_callback_http_filter_increment_gauge)
  SL_NEED(envoy_dynamic_module_callback_http_filter_decrement_gauge)
  SL_NEED(envoy_dynamic_module_callback_http_filter_record_histogram_value)
#undef SL_NEED
  return NULL;
}

const char* envoy_dynamic_module_on_program_init(void) {
  const char* missing = sl_missing_callback();
  if (missing != NULL) {
    // Envoy's own log cannot be reached without its callbacks: stderr is Envoy's log too.
    fprintf(stderr,
            "sluice: libsluice.so cannot load in this Envoy: it lacks %s. libsluice.so needs "
            "the dynamic-module ABI of Envoy 1.38 or later (v0.1.0, v0.2.0: tested on 1.40); "
            "for Envoy 1.36 and 1.37 use sluice.wasm\n",
            missing);
    return NULL;
  }
  return sl_abi_version;
}

const void* envoy_dynamic_module_on_http_filter_config_new(void* config_envoy, sl_buf name, sl_buf config) {
  uint32_t idx = sluiceConfigNew(config_envoy, (char*)name.ptr, name.length, (char*)config.ptr, config.length);
  return idx == 0 ? NULL : (const void*)(uintptr_t)idx;
}

void envoy_dynamic_module_on_http_filter_config_destroy(const void* config) {
  sluiceConfigDestroy((uint32_t)(uintptr_t)config);
}

const void* envoy_dynamic_module_on_http_filter_new(const void* config, void* filter_envoy) {
  sl_stream* s = calloc(1, sizeof(sl_stream));
  if (s == NULL) {
    return NULL;  // Envoy closes the stream
  }
  s->envoy = filter_envoy;
  s->config = (uint32_t)(uintptr_t)config;
  s->hdrs = s->inline_hdrs;
  return s;
}

static void sl_free(sl_stream* s) {
  if (s->hdrs != s->inline_hdrs) {
    free(s->hdrs);
  }
  free(s);
}

// sl_after_go ends a call into Go for s: a stream Envoy destroyed meanwhile (a local reply
// sent from Go can end it at once) is freed now.
static int sl_after_go(sl_stream* s, int ret) {
  s->in_go = 0;
  if (s->destroyed) {
    sl_free(s);
  }
  return ret;
}

int envoy_dynamic_module_on_http_filter_request_headers(void* filter_envoy, const void* filter, bool end_of_stream) {
  sl_stream* s = (sl_stream*)filter;
  s->envoy = filter_envoy;
  s->in_go = 1;
  return sl_after_go(s, sluiceRequestHeaders(s, end_of_stream));
}

// sl_body_parts says which of Envoy's body views make up a stream's body so far: the
// buffered body, then the chunk of the current hook unless it is the buffered body itself
// (*same).
static void sl_body_parts(void* filter_envoy, bool response, int* buffered, int* received, bool* same) {
  *buffered = response ? SL_BUFFERED_RESPONSE_BODY : SL_BUFFERED_REQUEST_BODY;
  *received = response ? SL_RECEIVED_RESPONSE_BODY : SL_RECEIVED_REQUEST_BODY;
  *same = response ? envoy_dynamic_module_callback_http_received_buffered_response_body(filter_envoy)
                   : envoy_dynamic_module_callback_http_received_buffered_request_body(filter_envoy);
}

static size_t sl_body_size(void* filter_envoy, bool response) {
  int buffered, received;
  bool same;
  sl_body_parts(filter_envoy, response, &buffered, &received, &same);
  size_t n = envoy_dynamic_module_callback_http_get_body_size(filter_envoy, buffered);
  if (!same) {
    n += envoy_dynamic_module_callback_http_get_body_size(filter_envoy, received);
  }
  return n;
}

int envoy_dynamic_module_on_http_filter_request_body(void* filter_envoy, const void* filter, bool end_of_stream) {
  sl_stream* s = (sl_stream*)filter;
  if (s->state != SL_LIVE) {
    return 0;  // Continue
  }
  s->in_go = 1;
  return sl_after_go(s, sluiceRequestBody(s, sl_body_size(filter_envoy, false), end_of_stream));
}

int envoy_dynamic_module_on_http_filter_request_trailers(void* filter_envoy, const void* filter) { return 0; }

int envoy_dynamic_module_on_http_filter_response_headers(void* filter_envoy, const void* filter, bool end_of_stream) {
  sl_stream* s = (sl_stream*)filter;
  if (s->state == SL_ENDED) {
    const char* p = s->hdrs;
    for (uint16_t i = 0; i < s->nhdrs; i++) {
      uint16_t nl, vl;
      memcpy(&nl, p, 2);
      memcpy(&vl, p + 2, 2);
      sl_buf k = {p + 4, nl}, v = {p + 4 + nl, vl};
      envoy_dynamic_module_callback_http_add_header(filter_envoy, SL_RESPONSE_HEADERS, k, v);
      p += 4 + nl + vl;
    }
    s->nhdrs = 0;
    return 0;
  }
  if (s->state != SL_LIVE) {
    return 0;
  }
  s->in_go = 1;
  return sl_after_go(s, sluiceResponseHeaders(s, end_of_stream));
}

int envoy_dynamic_module_on_http_filter_response_body(void* filter_envoy, const void* filter, bool end_of_stream) {
  sl_stream* s = (sl_stream*)filter;
  if (s->state != SL_LIVE) {
    return 0;
  }
  s->in_go = 1;
  return sl_after_go(s, sluiceResponseBody(s, sl_body_size(filter_envoy, true), end_of_stream));
}

int envoy_dynamic_module_on_http_filter_response_trailers(void* filter_envoy, const void* filter) {
  sl_stream* s = (sl_stream*)filter;
  if (s->state != SL_LIVE) {
    return 0;
  }
  s->in_go = 1;
  return sl_after_go(s, sluiceResponseTrailers(s));
}

void envoy_dynamic_module_on_http_filter_stream_complete(void* filter_envoy, const void* filter) {}

void envoy_dynamic_module_on_http_filter_destroy(const void* filter) {
  sl_stream* s = (sl_stream*)filter;
  if (s->state == SL_LIVE) {
    sluiceDestroy(s);  // sets state to SL_ENDED
  }
  if (s->in_go) {
    s->destroyed = 1;  // freed when the hook in Go returns
    return;
  }
  sl_free(s);
}

void envoy_dynamic_module_on_http_filter_scheduled(void* filter_envoy, const void* filter, uint64_t event_id) {
  sl_stream* s = (sl_stream*)filter;
  if (s->state != SL_LIVE) {
    return;
  }
  s->in_go = 1;
  sl_after_go(s, (sluiceScheduled(s, event_id), 0));
}

// Unused: sluice makes no callouts and is never a terminal filter.
void envoy_dynamic_module_on_http_filter_http_callout_done(void* filter_envoy, const void* filter, uint64_t id, int result, sl_header* headers, size_t headers_size, sl_buf* body, size_t body_size) {}
void envoy_dynamic_module_on_http_filter_http_stream_headers(void* filter_envoy, const void* filter, uint64_t id, sl_header* headers, size_t headers_size, bool end_stream) {}
void envoy_dynamic_module_on_http_filter_http_stream_data(void* filter_envoy, const void* filter, uint64_t id, const sl_buf* data, size_t data_count, bool end_stream) {}
void envoy_dynamic_module_on_http_filter_http_stream_trailers(void* filter_envoy, const void* filter, uint64_t id, sl_header* trailers, size_t trailers_size) {}
void envoy_dynamic_module_on_http_filter_http_stream_complete(void* filter_envoy, const void* filter, uint64_t id) {}
void envoy_dynamic_module_on_http_filter_http_stream_reset(void* filter_envoy, const void* filter, uint64_t id, int reason) {}
void envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(void* filter_envoy, const void* filter) {}
void envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(void* filter_envoy, const void* filter) {}

// Helpers Go calls (cgo.go): each turns Go's (pointer, length) arguments into the ABI's
// structures, and keeps per-thread arrays for the calls that fill one.

void sl_log(int level, const char* msg, size_t len) {
  sl_buf b = {msg, len};
  envoy_dynamic_module_callback_log(level, b);
}

bool sl_get_header(void* filter, int type, const char* name, size_t name_len, const char** value, size_t* value_len) {
  sl_buf key = {name, name_len}, out = {NULL, 0};
  if (!envoy_dynamic_module_callback_http_get_header(filter, type, key, &out, 0, NULL) || out.ptr == NULL) {
    return false;
  }
  *value = out.ptr;
  *value_len = out.length;
  return true;
}

static __thread sl_header* sl_hdr_array;
static __thread size_t sl_hdr_cap;

// sl_get_headers returns every header of a map in a per-thread array (valid until the next
// call on this thread), and their number in *n; NULL when the map is unavailable.
sl_header* sl_get_headers(void* filter, int type, size_t* n) {
  size_t size = envoy_dynamic_module_callback_http_get_headers_size(filter, type);
  if (size > sl_hdr_cap) {
    sl_header* a = realloc(sl_hdr_array, size * sizeof(sl_header));
    if (a == NULL) {
      return NULL;
    }
    sl_hdr_array = a;
    sl_hdr_cap = size;
  }
  if (size == 0) {
    *n = 0;
    return sl_hdr_array != NULL ? sl_hdr_array : (sl_header*)&sl_hdr_cap;
  }
  if (!envoy_dynamic_module_callback_http_get_headers(filter, type, sl_hdr_array)) {
    return NULL;
  }
  *n = size;
  return sl_hdr_array;
}

bool sl_add_header(void* filter, int type, const char* name, size_t name_len, const char* value, size_t value_len) {
  sl_buf k = {name, name_len}, v = {value, value_len};
  return envoy_dynamic_module_callback_http_add_header(filter, type, k, v);
}

// sl_send_response sends a local reply; packed holds n headers as prepared headers are
// (uint16 lengths, then name and value).
void sl_send_response(void* filter, uint32_t status, const char* packed, uint16_t n, const char* body, size_t body_len, const char* details, size_t details_len) {
  sl_header hs[64];
  size_t k = 0;
  const char* p = packed;
  for (uint16_t i = 0; i < n && k < 64; i++) {
    uint16_t nl, vl;
    memcpy(&nl, p, 2);
    memcpy(&vl, p + 2, 2);
    hs[k].key_ptr = p + 4;
    hs[k].key_length = nl;
    hs[k].value_ptr = p + 4 + nl;
    hs[k].value_length = vl;
    k++;
    p += 4 + nl + vl;
  }
  sl_buf b = {body, body_len}, d = {details, details_len};
  envoy_dynamic_module_callback_http_send_response(filter, status, hs, k, b, d);
}

static __thread sl_buf* sl_chunk_array;
static __thread size_t sl_chunk_cap;

// sl_body returns the chunks of a stream's body so far (buffered, then the chunk of the
// current hook unless it is the buffered body itself) in a per-thread array, their number in
// *n.
sl_buf* sl_body(void* filter, bool response, size_t* n) {
  int buffered, received;
  bool same;
  sl_body_parts(filter, response, &buffered, &received, &same);
  size_t nb = envoy_dynamic_module_callback_http_get_body_chunks_size(filter, buffered);
  size_t nr = same ? 0 : envoy_dynamic_module_callback_http_get_body_chunks_size(filter, received);
  size_t total = nb + nr;
  if (total > sl_chunk_cap) {
    sl_buf* a = realloc(sl_chunk_array, total * sizeof(sl_buf));
    if (a == NULL) {
      return NULL;
    }
    sl_chunk_array = a;
    sl_chunk_cap = total;
  }
  *n = 0;
  if (nb > 0 && envoy_dynamic_module_callback_http_get_body_chunks(filter, buffered, sl_chunk_array)) {
    *n = nb;
  }
  if (nr > 0 && envoy_dynamic_module_callback_http_get_body_chunks(filter, received, sl_chunk_array + *n)) {
    *n += nr;
  }
  return sl_chunk_array;
}

bool sl_attribute(void* filter, int id, const char** value, size_t* len) {
  sl_buf out = {NULL, 0};
  bool ok = id < 0 ? envoy_dynamic_module_callback_http_get_cluster_name(filter, &out)
                   : envoy_dynamic_module_callback_http_filter_get_attribute_string(filter, id, &out);
  if (!ok) {
    return false;
  }
  *value = out.ptr;
  *len = out.length;
  return true;
}

// sl_define_metric defines a metric without labels (kind 0 counter, 1 gauge, 2 histogram).
bool sl_define_metric(void* config, int kind, const char* name, size_t len, size_t* id) {
  sl_buf n = {name, len};
  int r;
  switch (kind) {
    case 0: r = envoy_dynamic_module_callback_http_filter_config_define_counter(config, n, NULL, 0, id); break;
    case 1: r = envoy_dynamic_module_callback_http_filter_config_define_gauge(config, n, NULL, 0, id); break;
    default: r = envoy_dynamic_module_callback_http_filter_config_define_histogram(config, n, NULL, 0, id); break;
  }
  return r == SL_METRICS_OK;
}

// sl_add_metric updates a metric: through the stream whose hook is running (filter), or,
// without one, through the configuration where this Envoy can (1.39 and later; 1.38 has
// only the stream's form: the update is then dropped, and false returned).
bool sl_add_metric(void* config, void* filter, int kind, size_t id, int64_t delta) {
  uint64_t v = delta >= 0 ? (uint64_t)delta : (uint64_t)(-delta);
  int r;
  if (filter != NULL) {
    switch (kind) {
      case 0: r = envoy_dynamic_module_callback_http_filter_increment_counter(filter, id, NULL, 0, v); break;
      case 1:
        r = delta >= 0 ? envoy_dynamic_module_callback_http_filter_increment_gauge(filter, id, NULL, 0, v)
                       : envoy_dynamic_module_callback_http_filter_decrement_gauge(filter, id, NULL, 0, v);
        break;
      default: r = envoy_dynamic_module_callback_http_filter_record_histogram_value(filter, id, NULL, 0, v); break;
    }
    return r == SL_METRICS_OK;
  }
  if (envoy_dynamic_module_callback_http_filter_config_increment_counter == NULL) {
    return false;
  }
  switch (kind) {
    case 0: r = envoy_dynamic_module_callback_http_filter_config_increment_counter(config, id, NULL, 0, v); break;
    case 1:
      r = delta >= 0 ? envoy_dynamic_module_callback_http_filter_config_increment_gauge(config, id, NULL, 0, v)
                     : envoy_dynamic_module_callback_http_filter_config_decrement_gauge(config, id, NULL, 0, v);
      break;
    default: r = envoy_dynamic_module_callback_http_filter_config_record_histogram_value(config, id, NULL, 0, v); break;
  }
  return r == SL_METRICS_OK;
}

// sl_set_metadata sets n attributes packed as prepared headers are, each name NAMESPACE.FIELD,
// as string fields of the stream's dynamic metadata (split at the first '.').
void sl_set_metadata(void* filter, const char* packed, uint16_t n) {
  if (!envoy_dynamic_module_callback_http_set_dynamic_metadata_string) {
    return;
  }
  const char* p = packed;
  for (uint16_t i = 0; i < n; i++) {
    uint16_t nl, vl;
    memcpy(&nl, p, 2);
    memcpy(&vl, p + 2, 2);
    const char* name = p + 4;
    const char* dot = memchr(name, '.', nl);
    if (dot != NULL) {
      sl_buf ns = {name, (size_t)(dot - name)};
      sl_buf key = {dot + 1, (size_t)(nl - (dot - name) - 1)};
      sl_buf value = {name + nl, vl};
      envoy_dynamic_module_callback_http_set_dynamic_metadata_string(filter, ns, key, value);
    }
    p += 4 + nl + vl;
  }
}
