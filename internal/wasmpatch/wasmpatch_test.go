package wasmpatch_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/sluice-proxy/sluice/host"
	"github.com/sluice-proxy/sluice/internal/wasmpatch"
)

// A guest whose request callback sleeps makes Go's scheduler call poll_oneoff on every
// request. In the strictest profile (cpp-host before #533: ENOSYS) the unpatched module
// dies on its first request; the patched one answers itself and never calls the host's.
func TestPollOneoffAnsweredByTheModule(t *testing.T) {
	orig := wasmpatch.BuildModule(t, "testdata/sleeper")
	patched, err := wasmpatch.PollOneoff(orig)
	if err != nil {
		t.Fatal(err)
	}
	again, err := wasmpatch.PollOneoff(patched)
	if err != nil || !bytes.Equal(again, patched) {
		t.Fatalf("patching twice changed the module (err %v)", err)
	}
	run := func(wasm []byte) host.Stats {
		h, err := host.New(context.Background(), host.Options{Wasm: wasm, Workers: 1,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close(context.Background())
		for i := 0; i < 20; i++ {
			if _, err := h.Exchange(context.Background(), &host.Request{Path: "/"}, nil); err != nil {
				t.Fatal(err)
			}
		}
		return h.Stats()
	}
	if st := run(orig); st.Failed == 0 || st.PollOneoffCalls == 0 {
		t.Errorf("unpatched: %d failed requests, %d poll_oneoff calls; want both > 0 (else this test proves nothing)", st.Failed, st.PollOneoffCalls)
	}
	if st := run(patched); st.Failed != 0 || st.VMRestarts != 0 || st.PollOneoffCalls != 0 {
		t.Errorf("patched: %d failed, %d restarts, %d poll_oneoff calls to the host; want 0", st.Failed, st.VMRestarts, st.PollOneoffCalls)
	}
}

// The shipped module patches cleanly, and still imports poll_oneoff (so it links on every
// cpp-host exactly as before).
func TestPatchSluiceModule(t *testing.T) {
	patched, err := wasmpatch.PollOneoff(wasmpatch.BuildModule(t, "../../cmd/sluice-wasm"))
	if err != nil {
		t.Fatal(err)
	}
	if !wasmpatch.ImportsFunction(patched, "wasi_snapshot_preview1", "poll_oneoff") || !bytes.Contains(patched, []byte(wasmpatch.ShimName)) {
		t.Error("patched module lacks the poll_oneoff import or the shim's name")
	}
	if wasmpatch.ImportsFunction(patched, "env", "proxy_redis_call") || !wasmpatch.ImportsFunction(patched, "env", "proxy_log") {
		t.Error("ImportsFunction: sluice.wasm imports proxy_log and not proxy_redis_call")
	}
}

func TestRefusesOtherInput(t *testing.T) {
	for _, in := range [][]byte{nil, []byte("not wasm"), []byte("\x00asm\x01\x00\x00\x00")} {
		if _, err := wasmpatch.PollOneoff(in); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}
