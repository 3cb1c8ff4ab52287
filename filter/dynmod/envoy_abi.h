// The part of Envoy's dynamic-module ABI (source/extensions/dynamic_modules/abi/abi.h, ABI
// v0.1.0 of Envoy 1.38/1.39 and the compatible v0.2.0 of 1.40) that sluice uses, declared
// here in sluice's own words: the layouts and signatures are the ABI's, the names of the
// types are ours. Every callback is declared weak: Envoy's binary provides them when it
// loads the module, a test binary leaves them null, and an Envoy that lacks one (the
// 1.36 family has another API) is detected at load (sl_missing_callback in hooks.c) instead
// of failing on a call.
#ifndef SLUICE_ENVOY_ABI_H
#define SLUICE_ENVOY_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// A byte range: envoy_dynamic_module_type_{envoy,module}_buffer.
typedef struct {
  const char* ptr;
  size_t length;
} sl_buf;

// A header: envoy_dynamic_module_type_{envoy,module}_http_header.
typedef struct {
  const char* key_ptr;
  size_t key_length;
  const char* value_ptr;
  size_t value_length;
} sl_header;

// envoy_dynamic_module_type_http_header_type
enum { SL_REQUEST_HEADERS = 0, SL_REQUEST_TRAILERS = 1, SL_RESPONSE_HEADERS = 2, SL_RESPONSE_TRAILERS = 3 };
// envoy_dynamic_module_type_http_body_type
enum { SL_RECEIVED_REQUEST_BODY = 0, SL_BUFFERED_REQUEST_BODY = 1, SL_RECEIVED_RESPONSE_BODY = 2, SL_BUFFERED_RESPONSE_BODY = 3 };
// envoy_dynamic_module_type_metrics_result: 0 is success.
enum { SL_METRICS_OK = 0 };

#define SL_WEAK __attribute__((weak))

SL_WEAK void envoy_dynamic_module_callback_log(int level, sl_buf message);
SL_WEAK bool envoy_dynamic_module_callback_log_enabled(int level);
SL_WEAK uint32_t envoy_dynamic_module_callback_get_concurrency(void);

SL_WEAK bool envoy_dynamic_module_callback_http_get_header(void* filter, int type, sl_buf key, sl_buf* result, size_t index, size_t* optional_size);
SL_WEAK size_t envoy_dynamic_module_callback_http_get_headers_size(void* filter, int type);
SL_WEAK bool envoy_dynamic_module_callback_http_get_headers(void* filter, int type, sl_header* result);
SL_WEAK bool envoy_dynamic_module_callback_http_add_header(void* filter, int type, sl_buf key, sl_buf value);

SL_WEAK void envoy_dynamic_module_callback_http_send_response(void* filter, uint32_t status, sl_header* headers, size_t headers_size, sl_buf body, sl_buf details);
SL_WEAK void envoy_dynamic_module_callback_http_filter_continue_decoding(void* filter);
// Optional: without it the decision attributes are dropped. Declared void: some releases
// return a bool, which sluice does not read.
SL_WEAK void envoy_dynamic_module_callback_http_set_dynamic_metadata_string(void* filter, sl_buf ns, sl_buf key, sl_buf value);

SL_WEAK void* envoy_dynamic_module_callback_http_filter_scheduler_new(void* filter);
SL_WEAK void envoy_dynamic_module_callback_http_filter_scheduler_commit(void* scheduler, uint64_t event_id);
SL_WEAK void envoy_dynamic_module_callback_http_filter_scheduler_delete(void* scheduler);

SL_WEAK size_t envoy_dynamic_module_callback_http_get_body_size(void* filter, int type);
SL_WEAK size_t envoy_dynamic_module_callback_http_get_body_chunks_size(void* filter, int type);
SL_WEAK bool envoy_dynamic_module_callback_http_get_body_chunks(void* filter, int type, sl_buf* result);
SL_WEAK bool envoy_dynamic_module_callback_http_received_buffered_request_body(void* filter);
SL_WEAK bool envoy_dynamic_module_callback_http_received_buffered_response_body(void* filter);

SL_WEAK bool envoy_dynamic_module_callback_http_filter_get_attribute_string(void* filter, int id, sl_buf* result);
SL_WEAK bool envoy_dynamic_module_callback_http_get_cluster_name(void* filter, sl_buf* result);
SL_WEAK uint32_t envoy_dynamic_module_callback_http_filter_get_worker_index(void* filter);

SL_WEAK int envoy_dynamic_module_callback_http_filter_config_define_counter(void* config, sl_buf name, sl_buf* label_names, size_t label_names_length, size_t* id);
SL_WEAK int envoy_dynamic_module_callback_http_filter_config_define_gauge(void* config, sl_buf name, sl_buf* label_names, size_t label_names_length, size_t* id);
SL_WEAK int envoy_dynamic_module_callback_http_filter_config_define_histogram(void* config, sl_buf name, sl_buf* label_names, size_t label_names_length, size_t* id);
SL_WEAK int envoy_dynamic_module_callback_http_filter_increment_counter(void* filter, size_t id, sl_buf* label_values, size_t label_values_length, uint64_t value);
SL_WEAK int envoy_dynamic_module_callback_http_filter_increment_gauge(void* filter, size_t id, sl_buf* label_values, size_t label_values_length, uint64_t value);
SL_WEAK int envoy_dynamic_module_callback_http_filter_decrement_gauge(void* filter, size_t id, sl_buf* label_values, size_t label_values_length, uint64_t value);
SL_WEAK int envoy_dynamic_module_callback_http_filter_record_histogram_value(void* filter, size_t id, sl_buf* label_values, size_t label_values_length, uint64_t value);
// The configuration-level updates: Envoy 1.39 and later only (optional).
SL_WEAK int envoy_dynamic_module_callback_http_filter_config_increment_counter(void* config, size_t id, sl_buf* label_values, size_t label_values_length, uint64_t value);
SL_WEAK int envoy_dynamic_module_callback_http_filter_config_increment_gauge(void* config, size_t id, sl_buf* label_values, size_t label_values_length, uint64_t value);
SL_WEAK int envoy_dynamic_module_callback_http_filter_config_decrement_gauge(void* config, size_t id, sl_buf* label_values, size_t label_values_length, uint64_t value);
SL_WEAK int envoy_dynamic_module_callback_http_filter_config_record_histogram_value(void* config, size_t id, sl_buf* label_values, size_t label_values_length, uint64_t value);

// The module's record of one stream (the filter_module_ptr Envoy hands back to every hook).
// Hooks that need nothing of Go read it in C; Go fills it in its first call.
enum {
  SL_NEW = 0,   // Go has not seen the stream
  SL_LIVE = 1,  // the VM holds the stream: its later hooks go to Go
  SL_ENDED = 2, // Go is done with it: C adds the prepared response headers, if any
};

#define SL_INLINE_HEADERS 384

typedef struct {
  void* envoy;        // filter_envoy_ptr
  uint32_t config;    // the configuration's index (filterConfig)
  uint32_t worker;    // the worker's index
  uint32_t id;        // the stream's context id in the worker's VM
  uint8_t state;      // SL_NEW, SL_LIVE, SL_ENDED
  uint8_t in_go;      // a hook of this stream is in Go (destroy must wait to free it)
  uint8_t destroyed;  // Envoy destroyed the stream while in_go
  // Response headers for C to add: n of them, each a uint16 name length, a uint16 value
  // length, the name, the value; in inline_hdrs or, when larger, in malloc'd memory.
  uint16_t nhdrs;
  uint32_t hdrs_len;
  char* hdrs;
  char inline_hdrs[SL_INLINE_HEADERS];
} sl_stream;

#endif
