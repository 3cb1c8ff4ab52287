package filter_test

import "testing"

// The filter's store protocol keeps admissions exact under both shared-data
// semantics it meets: Envoy's (and the embedded host's) and the proxytest
// emulator's.
func TestStoreProtocolUnderBothSemantics(t *testing.T) {
	for _, pt := range []bool{false, true} {
		name := "envoy"
		if pt {
			name = "proxytest"
		}
		t.Run(name, func(t *testing.T) {
			cfg := `{"rules":[{"name":"r","key":[{"remote_ip":true}],"algorithm":"sliding_window","limit":3,"window":"1h"}]}`
			wa, wb := twoWorkers(t, cfg)
			wa.Host.Shared.ProxytestSemantics = pt
			admitted := 0
			// Every request of A races with one of B for the same key.
			wa.Host.SetHook = func(string) {
				wa.Host.SetHook = nil
				if wb.Do(req("10.0.0.1:1")).Status == 200 {
					admitted++
				}
			}
			for i := 0; i < 6; i++ {
				if wa.Do(req("10.0.0.1:1")).Status == 200 {
					admitted++
				}
				wa.Host.SetHook = func(string) {
					wa.Host.SetHook = nil
					if wb.Do(req("10.0.0.1:1")).Status == 200 {
						admitted++
					}
				}
			}
			if admitted != 3 {
				t.Errorf("admitted %d, want exactly 3", admitted)
			}
			if n := len(wa.Host.Shared.Keys("sluice::r:")); n != 1 {
				t.Errorf("%d entries", n)
			}
		})
	}
}
