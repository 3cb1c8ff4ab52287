// A no-op Envoy dynamic module in C (libnoopdm.so), bench/envoy's family dm-noop-c: the least
// an HTTP dynamic module costs. It defines the 21 hooks Envoy 1.40 resolves when it loads an
// HTTP filter configuration; per request it reads the x-key request header once (the one
// callback every limiter makes) and continues. Nothing else: no state, no allocation, no
// metrics. Compared with dm-noop-go (libsluice.so whose only rule never matches), it isolates
// what entering the Go runtime costs.
//
//	gcc -shared -fPIC -O2 -o libnoopdm.so noop_dynmod.c
//
// The types are the ABI's (source/extensions/dynamic_modules/abi/abi.h, v0.2.0 in Envoy
// 1.40), declared here in short; the callback is Envoy's, resolved when Envoy loads the
// library.
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// envoy_dynamic_module_type_{envoy,module}_buffer
typedef struct {
  const char* ptr;
  size_t length;
} nd_buf;

// envoy_dynamic_module_type_{envoy,module}_http_header
typedef struct {
  const char* key_ptr;
  size_t key_length;
  const char* value_ptr;
  size_t value_length;
} nd_header;

// envoy_dynamic_module_type_http_header_type_RequestHeader
enum { ND_REQUEST_HEADERS = 0 };

bool envoy_dynamic_module_callback_http_get_header(void* filter_envoy, int type, nd_buf key, nd_buf* result,
                                                   size_t index, size_t* optional_size);

// The one configuration object and the one stream object every hook is handed back: the
// module keeps nothing per stream, but Envoy wants non-NULL pointers.
static const char nd_config = 'c';
static const char nd_stream = 's';

// noop_sink keeps the header read from being optimised away.
volatile size_t noop_sink;

const char* envoy_dynamic_module_on_program_init(void) { return "v0.2.0"; }

const void* envoy_dynamic_module_on_http_filter_config_new(void* config_envoy, nd_buf name, nd_buf config) {
  return &nd_config;
}

void envoy_dynamic_module_on_http_filter_config_destroy(const void* config) {}

const void* envoy_dynamic_module_on_http_filter_new(const void* config, void* filter_envoy) { return &nd_stream; }

int envoy_dynamic_module_on_http_filter_request_headers(void* filter_envoy, const void* filter, bool end_of_stream) {
  static const char name[] = "x-key";
  nd_buf key = {name, sizeof name - 1}, value = {NULL, 0};
  if (envoy_dynamic_module_callback_http_get_header(filter_envoy, ND_REQUEST_HEADERS, key, &value, 0, NULL)) {
    noop_sink = value.length;
  }
  return 0;  // Continue
}

int envoy_dynamic_module_on_http_filter_request_body(void* filter_envoy, const void* filter, bool end_of_stream) { return 0; }
int envoy_dynamic_module_on_http_filter_request_trailers(void* filter_envoy, const void* filter) { return 0; }
int envoy_dynamic_module_on_http_filter_response_headers(void* filter_envoy, const void* filter, bool end_of_stream) { return 0; }
int envoy_dynamic_module_on_http_filter_response_body(void* filter_envoy, const void* filter, bool end_of_stream) { return 0; }
int envoy_dynamic_module_on_http_filter_response_trailers(void* filter_envoy, const void* filter) { return 0; }
void envoy_dynamic_module_on_http_filter_stream_complete(void* filter_envoy, const void* filter) {}
void envoy_dynamic_module_on_http_filter_destroy(const void* filter) {}
void envoy_dynamic_module_on_http_filter_http_callout_done(void* filter_envoy, const void* filter, uint64_t id, int result,
                                                           nd_header* headers, size_t headers_size, nd_buf* body, size_t body_size) {}
void envoy_dynamic_module_on_http_filter_http_stream_headers(void* filter_envoy, const void* filter, uint64_t id,
                                                             nd_header* headers, size_t headers_size, bool end_stream) {}
void envoy_dynamic_module_on_http_filter_http_stream_data(void* filter_envoy, const void* filter, uint64_t id,
                                                          const nd_buf* data, size_t data_count, bool end_stream) {}
void envoy_dynamic_module_on_http_filter_http_stream_trailers(void* filter_envoy, const void* filter, uint64_t id,
                                                              nd_header* trailers, size_t trailers_size) {}
void envoy_dynamic_module_on_http_filter_http_stream_complete(void* filter_envoy, const void* filter, uint64_t id) {}
void envoy_dynamic_module_on_http_filter_http_stream_reset(void* filter_envoy, const void* filter, uint64_t id, int reason) {}
void envoy_dynamic_module_on_http_filter_scheduled(void* filter_envoy, const void* filter, uint64_t event_id) {}
void envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(void* filter_envoy, const void* filter) {}
void envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(void* filter_envoy, const void* filter) {}
