// Package usage reads token counts out of LLM API bodies as they stream
// through the filter, a chunk at a time, for token budgets: the cost of a
// response (from its usage report) and a request's reservation (from a field
// of its JSON body, such as max_tokens).
//
// It never holds a body: every reader here has a fixed-size state, and once
// set up (NewMeter, NewExtractor, Compile) reading a chunk allocates nothing.
// It uses no encoding/json, reflect or fmt, and builds for wasip1.
//
// # Pieces
//
//   - Extractor: a streaming JSON scanner that validates one document
//     (RFC 8259, as encoding/json does) and records the integer at each of up
//     to MaxPaths dotted paths (Compile), skipping everything else unbuffered.
//   - Splitter: a text/event-stream splitter (WHATWG rules) that hands each
//     event's data to a Sink as it arrives.
//   - Meter: a provider's table of paths on top of both, fed a response body
//     and its mode (ModeFor(content-type)), answering once at the end with a
//     Result: the token counts by Field, whether usage was Seen, and the Cost
//     under Weights.
//
// # Formats (Meter)
//
// OpenAI, ModeJSON (application/json, application/*+json):
// Chat Completions usage.prompt_tokens → Input, usage.completion_tokens →
// Output, usage.total_tokens → Total, usage.prompt_tokens_details.cached_tokens
// → CacheRead; Responses usage.input_tokens, usage.output_tokens,
// usage.total_tokens, usage.input_tokens_details.cached_tokens, likewise.
//
// OpenAI, ModeSSE (text/event-stream): each event's data is one JSON document
// read with the same table plus response.usage.* (the Responses API's
// response.completed, .incomplete and .failed events). Chat chunks carry
// "usage": null until the last (with stream_options.include_usage), which is
// then Found. An event whose data is exactly "[DONE]" ends the stream (Done)
// and is neither JSON nor a bad event; "[DONE] " or "[DONE]\n..." is bad.
//
// Anthropic, ModeJSON: usage.input_tokens → Input, usage.output_tokens →
// Output, usage.cache_read_input_tokens → CacheRead,
// usage.cache_creation_input_tokens → CacheWrite. ModeSSE: the same paths
// (the message_delta event) and message.usage.* (the message_start event);
// the message_stop event sets Done. Anthropic reports no total: Total stays
// Absent (weight Input, CacheRead, CacheWrite and Output instead). Note that
// OpenAI's Input includes its cached tokens while Anthropic's excludes them.
//
// Within one document, if two paths of one field are present, the first in
// the table wins. Across a stream's events a Found count replaces the one
// before it (Anthropic's counts are cumulative, OpenAI reports once: the
// last report wins); an unusable value (a string, a negative...) never
// replaces a Found one; an event without usage changes nothing. A stream
// that ends with nothing Found has Seen false: the caller applies its own
// rule. The Meter reads bytes as given: a compressed body (Content-Encoding)
// is not JSON and ends Malformed with nothing Seen.
//
// # Paths and values (Extractor)
//
// A path is object keys joined by dots ("usage.total_tokens"), matched
// exactly (case-sensitive) against keys as decoded, escapes included.
// Array indices are not supported: a path never descends into an array.
// Keys are printable ASCII, at most MaxSegmentLen bytes, at most
// MaxSegments a path. For each path the Extractor reports a Status:
//
//   - Found: an integer in [0, math.MaxInt64]: 12, 0, -0.
//   - OutOfRange: an integer below 0 (-5) or above math.MaxInt64 (any
//     number of digits is read in O(1) state).
//   - NotInteger: 12.0, 1e3, 1.5 (no fraction or exponent is accepted, even
//     integral: APIs send counts as integers), "12" (a string is never
//     converted), true, false, an object, an array.
//   - Absent: the path is missing, its value is null, or a key on the way
//     holds a non-object (null, a number, an array...).
//
// Duplicated keys: the last wins, as when encoding/json decodes into a map;
// a duplicate of a key on the way (a second "usage") replaces everything
// found under the first.
//
// A value counts once it is committed: its last byte and the delimiter after
// it (',' '}' ']' or whitespace) were read, inside a well-formed document so
// far. Nothing that comes after (malformed bytes, a size bound, a stream cut
// short) takes a committed value back; the document's DocStatus reports the
// problem. For a budget this is the safe side: a usage report is never
// dropped because of what follows it, and garbage cannot fabricate one,
// since a number is committed only in a well-formed prefix (a number cut by
// the end of a chunk, or "01", counts for nothing).
//
// Whole-document verdicts (DocStatus): DocOK; DocEmpty (only whitespace);
// DocMalformed (not JSON, cut short, trailing bytes, a UTF-8 BOM: exactly
// what encoding/json refuses, except that invalid UTF-8 inside strings is
// accepted, as it does); DocTooDeep (nesting beyond MaxDepth, 256);
// DocTooLarge (beyond a byte limit given to Reset, none by default). Reading
// stops at the first problem and ignores the rest.
//
// # Event streams (Splitter)
//
// Lines end at CRLF, LF or CR (also split across chunks); an initial UTF-8
// BOM is dropped; ':' lines are comments; "data" values are joined with
// "\n"; the last "event" value is the type (MaxEventType bytes kept); "id",
// "retry" and other fields are ignored; a blank line ends an event, which is
// dispatched if it had a "data" field. Bounds: a line longer than
// MaxLineBytes (1 MiB default) or an event's data longer than MaxEventBytes
// (8 MiB default) marks the event skipped (counted in SkippedEvents): the
// rest of its data is not read, what it committed before stands, and the
// next event is read normally, so an endless line or event costs no memory.
// An event whose data is not a complete well-formed document is counted in
// BadEvents (empty data is not). One departure from the spec: a stream that
// ends inside an event dispatches it (Incomplete) instead of discarding it,
// so a usage report the upstream sent counts even if the final blank line
// never came.
//
// # Cost
//
// Cost = ⌈Σ W[f] × count[f] / Div⌉ over Found fields: integer weights
// (|W| ≤ MaxWeight = 2³²) over one divisor, so prices like 0.1 are exact;
// the sum is computed exactly in 128 bits, rounded up once at the end (a
// fractional cost is never rounded down to free), clamped below at 0
// (negative weights are allowed, e.g. to discount OpenAI's cached tokens,
// which Input includes) and saturated at math.MaxInt64 (Result.Saturated).
// Seen is true when a field with a non-zero weight was Found.
//
// # Bounds, in sum
//
// State, whatever the input: Extractor under 512 bytes (nesting to 256
// levels at one bit each, path matching per key byte against at most 32
// candidate keys, no key or string buffered); Splitter about 128 bytes (a
// 32-byte event type included); Meter under 1 KB, one of each
// (TestStateSize). Throughput on one core of the
// development machine: 300-700 MB/s (BenchmarkMeter*).
package usage
