package usage

import (
	"strings"
	"testing"
)

// A 256 KiB non-streamed completion: a long content string with escapes.
var bigChatJSON = strings.Replace(openAIChatJSON, `"content": "`,
	`"content": "`+strings.Repeat(`Lorem ipsum dolor sit amet, \"consectetur\" adipiscing elit.\n`, 4096), 1)

// A stream of 2,000 content chunks, then usage and [DONE].
var bigChatStream = func() string {
	var b strings.Builder
	chunk := `data: {"id":"chatcmpl-C3y1","object":"chat.completion.chunk","created":1754312400,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_5e10f5d6a9","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n"
	for i := 0; i < 2000; i++ {
		b.WriteString(chunk)
	}
	b.WriteString(openAIChatStream[strings.LastIndex(openAIChatStream, "data: {"):])
	return b.String()
}()

func benchMeter(b *testing.B, p Provider, mode Mode, body string, chunk int) {
	in := []byte(body)
	m, err := NewMeter(p, priced, Limits{})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		m.Start(mode)
		for i := 0; i < len(in); i += chunk {
			m.Write(in[i:min(i+chunk, len(in))])
		}
		if r := m.Finish(); !r.Seen {
			b.Fatal(r)
		}
	}
}

func BenchmarkMeterJSON(b *testing.B)      { benchMeter(b, OpenAI, ModeJSON, bigChatJSON, 16<<10) }
func BenchmarkMeterJSONSmall(b *testing.B) { benchMeter(b, OpenAI, ModeJSON, openAIChatJSON, 16<<10) }
func BenchmarkMeterSSE(b *testing.B)       { benchMeter(b, OpenAI, ModeSSE, bigChatStream, 16<<10) }
func BenchmarkMeterSSEAnthropic(b *testing.B) {
	benchMeter(b, Anthropic, ModeSSE, anthropicStream, 16<<10)
}
func BenchmarkMeterSSESmallChunks(b *testing.B) {
	benchMeter(b, OpenAI, ModeSSE, bigChatStream, 64)
}
