package usage_test

import (
	"fmt"

	"github.com/sluice-proxy/sluice/filter/usage"
)

func Example() {
	// Set up once: input tokens cost 1, output tokens 4.
	m, err := usage.NewMeter(usage.Anthropic, usage.Weights{W: [usage.NumFields]int64{usage.Input: 1, usage.Output: 4}}, usage.Limits{})
	if err != nil {
		panic(err)
	}
	// Per response: the mode from its content-type, then its body chunks.
	m.Start(usage.ModeFor("text/event-stream"))
	m.Write([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\nevent: message_del"))
	m.Write([]byte("ta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":10}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"))
	r := m.Finish()
	fmt.Println(r.Seen, r.Cost, r.Values[usage.Input], r.Values[usage.Output], r.Done)

	// A request's reservation: a field of its JSON body.
	p := usage.MustCompile("max_tokens")
	e := usage.NewExtractor(p)
	e.Write([]byte(`{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[]}`))
	doc := e.Finish()
	v, st := e.Value(0)
	fmt.Println(doc, v, st)
	// Output:
	// true 65 25 10 true
	// ok 1024 found
}
