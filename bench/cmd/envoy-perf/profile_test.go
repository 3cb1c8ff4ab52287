package main

import (
	"strings"
	"testing"
)

// A recording's shape as perf script prints it: a guest function's self sample, a host call
// (Envoy frames under a guest frame), a call into the guest (under the Envoy frames below
// the guest's outermost frame), Envoy alone, the kernel alone, and a V8 stub.
const script = `wrk:worker_0 100 
	    3e77aa000010 JS:github.com_sluice_proxy_sluice_filter.__Plugin_.onRequest-2399-turbofan (/tmp/perf-7.map)
	    3e77aa000020 JS:proxy_on_request_headers-1920-turbofan (/tmp/perf-7.map)
	    7f9de0ac050a Stub:c-wasm-entry:iii:i (/tmp/perf-7.map)
	         32da7a3 [unknown] (/tmp/x/envoy)
	         2fac060 [unknown] (/tmp/x/envoy)
	         2f556ed [unknown] (/tmp/x/envoy)
	         2f8030c [unknown] (/tmp/x/envoy)
	           891f5 start_thread (/usr/lib/x86_64-linux-gnu/libc.so.6)

wrk:worker_1 101 
	         2f683e9 [unknown] (/tmp/x/envoy)
	         2facd35 [unknown] (/tmp/x/envoy)
	    3e77aa0000ff [unknown] (/tmp/perf-7.map)
	    3e77aa000030 JS:github.com_sluice_proxy_sluice_filter_abi.proxyGetHeaderMapValue-1882-turbofan (/tmp/perf-7.map)
	    3e77aa000020 JS:proxy_on_request_headers-1920-turbofan (/tmp/perf-7.map)
	    7f9de0ac050a Stub:c-wasm-entry:iii:i (/tmp/perf-7.map)
	         32da7a3 [unknown] (/tmp/x/envoy)
	         2fac060 [unknown] (/tmp/x/envoy)
	         2f556ed [unknown] (/tmp/x/envoy)
	         2f8030c [unknown] (/tmp/x/envoy)

wrk:worker_1 101 
	         2f00001 [unknown] (/tmp/x/envoy)
	         2fac060 [unknown] (/tmp/x/envoy)
	         2f556ed [unknown] (/tmp/x/envoy)
	         2f8030c [unknown] (/tmp/x/envoy)

wrk:worker_0 100 
	          16d88b __memmove_avx512_unaligned_erms (/usr/lib/x86_64-linux-gnu/libc.so.6)
	         55e62a4 [unknown] (/tmp/x/envoy)

wrk:worker_0 100 
	ffffffff8225a106 do_syscall_64 ([kernel.kallsyms])
	          10aba4 __send (/usr/lib/x86_64-linux-gnu/libc.so.6)

wrk:worker_0 100 
	    3e77aa0000ff [unknown] (/tmp/perf-7.map)
	    3e77aa000030 JS:github.com_sluice_proxy_sluice_filter_abi.proxyGetHeaderMapValue-1882-turbofan (/tmp/perf-7.map)
`

func TestSort(t *testing.T) {
	ss, err := parseScript(strings.NewReader(script))
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 6 {
		t.Fatalf("%d samples, want 6", len(ss))
	}
	if ss[0].comm != "wrk:worker_0" || len(ss[0].frames) != 8 || ss[0].frames[3].addr != 0x32da7a3 || ss[0].frames[7].sym != "start_thread" {
		t.Fatalf("first sample parsed as %+v", ss[0])
	}
	c := &classifier{envoy: "/tmp/x/envoy"}
	b := c.sort(ss)
	want := map[string]int{sideGuest: 1, sideHost: 1, sideEntry: 1, sideEnvoy: 1, sideKernel: 1, sideStubs: 1}
	for _, s := range sides {
		if b.side[s] != want[s] {
			t.Errorf("%s: %d samples, want %d", s, b.side[s], want[s])
		}
	}
	if b.guest["filter.__Plugin_.onRequest"] != 1 || b.host["filter_abi.proxyGetHeaderMapValue"] != 1 || b.envoyL["__memmove_avx512_unaligned_erms (libc.so.6)"] != 1 {
		t.Errorf("items: guest %v host %v envoy %v", b.guest, b.host, b.envoyL)
	}
	if !b.named {
		t.Error("the perf map's names were not seen")
	}
	var out strings.Builder
	b.write(&out, 10, 5)
	if !strings.Contains(out.String(), "guest wasm code") || !strings.Contains(out.String(), "1.67") {
		t.Errorf("report:\n%s", out.String())
	}
}
