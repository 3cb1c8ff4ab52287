package host

import (
	"encoding/json"
	"net/http"
	"time"
)

// AdminStatus is the JSON document served at /status.
type AdminStatus struct {
	ABIVersion    string    `json:"abi_version"`
	VMID          string    `json:"vm_id"`
	RootID        string    `json:"root_id"`
	PluginName    string    `json:"plugin_name"`
	FailOpen      bool      `json:"fail_open"`
	FailurePolicy string    `json:"failure_policy"`
	Closed        bool      `json:"closed"`
	UptimeSeconds float64   `json:"uptime_seconds"`
	StartedAt     time.Time `json:"started_at"`
	Requests      uint64    `json:"requests"`
	VMRestarts    uint64    `json:"vm_restarts"`
	// ReloadBackoffs counts requests that found their worker's VM failed and were refused
	// a reload by FailReload's backoff (Envoy's wasm.<plugin>.vm_reload_backoff).
	ReloadBackoffs uint64              `json:"vm_reload_backoffs"`
	Failed         uint64              `json:"failed_requests"`
	MemoryLimit    uint64              `json:"memory_limit_bytes"`
	Workers        []AdminWorkerStatus `json:"workers"`
	SharedData     struct {
		Keys  int `json:"keys"`
		Bytes int `json:"bytes"`
	} `json:"shared_data"`
	// PluginConfig is plugin 0's configuration in force on worker 0; Plugins has every
	// plugin's, with the workers each is in force on.
	PluginConfig string              `json:"plugin_config"`
	Plugins      []AdminPluginStatus `json:"plugins"`
	// MetricsUnexposed are the guest metrics /metrics leaves out: their Prometheus name
	// or series is another's.
	MetricsUnexposed []string `json:"metrics_unexposed"`
	// TopKeys are the rules' heavy hitters (the filter's top_keys), per rule and kind.
	TopKeys []TopKeys `json:"top_keys"`
}

// AdminWorkerStatus is one worker in AdminStatus.
type AdminWorkerStatus struct {
	ID          int    `json:"id"`
	Healthy     bool   `json:"healthy"`
	MemoryBytes uint64 `json:"memory_bytes"`
	VMRestarts  uint64 `json:"vm_restarts"`
	Requests    uint64 `json:"requests"`
	Failed      uint64 `json:"failed_requests"`
}

// AdminPluginStatus is one plugin in AdminStatus.
type AdminPluginStatus struct {
	Plugin  int                 `json:"plugin"`
	Configs []AdminPluginConfig `json:"configs"`
}

// AdminPluginConfig is a configuration in force and its workers.
type AdminPluginConfig struct {
	Config  string `json:"config"`
	Workers []int  `json:"workers"`
}

// Status returns the document served at /status.
func (s Snapshot) Status() AdminStatus {
	st := s.Stats
	a := AdminStatus{
		ABIVersion:       st.ABIVersion,
		VMID:             s.VMID,
		RootID:           s.RootID,
		PluginName:       s.PluginName,
		FailOpen:         s.FailOpen,
		FailurePolicy:    s.FailurePolicy.String(),
		Closed:           s.Closed,
		UptimeSeconds:    st.Uptime.Seconds(),
		StartedAt:        s.StartedAt.UTC(),
		Requests:         st.Requests,
		VMRestarts:       st.VMRestarts,
		ReloadBackoffs:   st.ReloadBackoffs,
		Failed:           st.Failed,
		MemoryLimit:      s.MemoryLimitBytes,
		Workers:          []AdminWorkerStatus{},
		Plugins:          []AdminPluginStatus{},
		MetricsUnexposed: []string{},
		TopKeys:          s.TopKeys,
	}
	a.SharedData.Keys, a.SharedData.Bytes = st.SharedData.Keys, st.SharedData.Bytes
	for _, w := range st.Workers {
		a.Workers = append(a.Workers, AdminWorkerStatus{ID: w.ID, Healthy: w.Healthy, MemoryBytes: w.MemoryBytes, VMRestarts: w.VMRestarts, Requests: w.Requests, Failed: w.Failed})
	}
	for _, p := range s.Plugins {
		ps := AdminPluginStatus{Plugin: p.Plugin}
		for _, c := range p.Configs {
			ps.Configs = append(ps.Configs, AdminPluginConfig{Config: string(c.Config), Workers: c.Workers})
		}
		a.Plugins = append(a.Plugins, ps)
	}
	if len(s.Plugins) > 0 {
		a.PluginConfig = string(s.Plugins[0].Config())
	}
	if _, unexposed := s.promFamilies(); unexposed != nil {
		a.MetricsUnexposed = unexposed
	}
	return a
}

// Health is what /healthz answers: "ok", or why not — "closed" after Close, or that a
// worker has no VM.
func (s Snapshot) Health() (ok bool, reason string) {
	if s.Closed {
		return false, "closed"
	}
	for _, w := range s.Stats.Workers {
		if !w.Healthy {
			return false, "unhealthy: a worker has no VM"
		}
	}
	return true, "ok"
}

// AdminHandler serves, each from a fresh Snapshot, /metrics (Prometheus text: the guest's
// metrics and sluice_host_*), /status (AdminStatus as JSON) and /healthz ("ok", or 503
// with the reason: the host is closed, or a worker has no VM).
func (h *Host) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		h.Snapshot().WritePrometheus(w)
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(h.Snapshot().Status())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		ok, reason := h.Snapshot().Health()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		w.Write([]byte(reason + "\n"))
	})
	return mux
}
