package host

import "github.com/sluice-proxy/sluice/internal/shareddata"

// SharedData is the shared-data map of one vm_id, with Envoy's semantics (the rule is
// written once, in internal/shareddata): Get returns the value and its cas; Set with cas 0
// is unconditional; Set with a nonzero cas fails with StatusCASMismatch when the key exists
// and its cas differs; the cas is ignored when the key does not exist. Each successful Set
// gives the key a new, never-zero cas. There is no delete. Safe for concurrent use.
type SharedData = shareddata.Map

func newSharedData() *SharedData { return shareddata.New() }
