package usage

import "strings"

// Realistic bodies, written for these tests in the shape the providers' APIs
// return. The content strings hold braces, quotes, escapes and the words
// "usage" and "total_tokens", which must be skipped as text.

const openAIChatJSON = `{
  "id": "chatcmpl-C3xYz9KpQ2mN7vLwR4tB8sE1aFgH",
  "object": "chat.completion",
  "created": 1754312345,
  "model": "gpt-4o-mini-2024-07-18",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": "Here is the JSON you asked for:\n` + "```" + `json\n{\"usage\": {\"total_tokens\": 999999}, \"note\": \"a \\\"quoted\\\" word\"}\n` + "```" + `\nTokens are counted by the API, not by me. \u00e9\u4e2d\ud83d\ude00",
        "refusal": null,
        "annotations": []
      },
      "logprobs": null,
      "finish_reason": "stop"
    }
  ],
  "usage": {
    "prompt_tokens": 1117,
    "completion_tokens": 46,
    "total_tokens": 1163,
    "prompt_tokens_details": {
      "cached_tokens": 1024,
      "audio_tokens": 0
    },
    "completion_tokens_details": {
      "reasoning_tokens": 0,
      "audio_tokens": 0,
      "accepted_prediction_tokens": 0,
      "rejected_prediction_tokens": 0
    }
  },
  "service_tier": "default",
  "system_fingerprint": "fp_5e10f5d6a9"
}
`

const openAIChatStream = "" +
	`data: {"id":"chatcmpl-C3y1","object":"chat.completion.chunk","created":1754312400,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_5e10f5d6a9","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n" +
	`data: {"id":"chatcmpl-C3y1","object":"chat.completion.chunk","created":1754312400,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_5e10f5d6a9","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n" +
	`data: {"id":"chatcmpl-C3y1","object":"chat.completion.chunk","created":1754312400,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_5e10f5d6a9","choices":[{"index":0,"delta":{"content":"! \"usage\":{\"total_tokens\":5}\n\n"},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n" +
	`data: {"id":"chatcmpl-C3y1","object":"chat.completion.chunk","created":1754312400,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_5e10f5d6a9","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}` + "\n\n" +
	`data: {"id":"chatcmpl-C3y1","object":"chat.completion.chunk","created":1754312400,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_5e10f5d6a9","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}` + "\n\n" +
	"data: [DONE]\n\n"

const openAIResponsesJSON = `{"id":"resp_68af4c2b1d3c8190a1b2c3d4e5f60718","object":"response","created_at":1756318763,"status":"completed","background":false,"error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,"model":"gpt-4.1-2025-04-14","output":[{"id":"msg_68af4c2c","type":"message","status":"completed","content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"In a quiet forest glade, a unicorn named Lumina..."}],"role":"assistant"}],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,"temperature":1.0,"text":{"format":{"type":"text"},"verbosity":"medium"},"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled","usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123},"user":null,"metadata":{}}`

const openAIResponsesStream = "" +
	"event: response.created\n" +
	`data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","created_at":1756318800,"status":"in_progress","model":"gpt-4.1-2025-04-14","output":[],"usage":null}}` + "\n\n" +
	"event: response.output_text.delta\n" +
	`data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi"}` + "\n\n" +
	"event: response.completed\n" +
	`data: {"type":"response.completed","sequence_number":9,"response":{"id":"resp_1","object":"response","created_at":1756318800,"status":"completed","model":"gpt-4.1-2025-04-14","output":[{"id":"msg_1","type":"message","status":"completed","content":[{"type":"output_text","annotations":[],"text":"Hi there"}],"role":"assistant"}],"usage":{"input_tokens":300,"input_tokens_details":{"cached_tokens":256},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":302}}}` + "\n\n"

const anthropicJSON = `{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Hello! {\"usage\":{\"input_tokens\":1}} is just text."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2095,"cache_creation_input_tokens":120,"cache_read_input_tokens":1800,"cache_creation":{"ephemeral_5m_input_tokens":120,"ephemeral_1h_input_tokens":0},"output_tokens":503,"service_tier":"standard"}}`

const anthropicStream = "" +
	"event: message_start\n" +
	`data: {"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":472,"cache_creation_input_tokens":0,"cache_read_input_tokens":2048,"output_tokens":2,"service_tier":"standard"}}}` + "\n\n" +
	"event: content_block_start\n" +
	`data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n" +
	"event: ping\n" +
	`data: {"type": "ping"}` + "\n\n" +
	"event: content_block_delta\n" +
	`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}` + "\n\n" +
	"event: content_block_delta\n" +
	`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"! usage: {\"output_tokens\": 1000000}"}}` + "\n\n" +
	"event: content_block_stop\n" +
	`data: {"type":"content_block_stop","index":0}` + "\n\n" +
	"event: message_delta\n" +
	`data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}` + "\n\n" +
	"event: message_stop\n" +
	`data: {"type":"message_stop"}` + "\n\n"

// crlf rewrites a stream's line ends as CRLF (or another terminator).
func crlf(s, nl string) string { return strings.ReplaceAll(s, "\n", nl) }
