package host

import (
	"encoding/json"
	"net/http"
	"time"
)

// AdminStatus is the JSON document served at /status.
type AdminStatus struct {
	ABIVersion    string              `json:"abi_version"`
	VMID          string              `json:"vm_id"`
	RootID        string              `json:"root_id"`
	PluginName    string              `json:"plugin_name"`
	FailOpen      bool                `json:"fail_open"`
	UptimeSeconds float64             `json:"uptime_seconds"`
	StartedAt     time.Time           `json:"started_at"`
	Requests      uint64              `json:"requests"`
	VMRestarts    uint64              `json:"vm_restarts"`
	Failed        uint64              `json:"failed_requests"`
	MemoryLimit   uint64              `json:"memory_limit_bytes"`
	Workers       []AdminWorkerStatus `json:"workers"`
	SharedData    struct {
		Keys  int `json:"keys"`
		Bytes int `json:"bytes"`
	} `json:"shared_data"`
	PluginConfig string `json:"plugin_config"`
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

// Status returns the document served at /status.
func (h *Host) Status() AdminStatus {
	st := h.Stats()
	a := AdminStatus{
		ABIVersion:    st.ABIVersion,
		VMID:          h.opts.VMID,
		RootID:        h.opts.RootID,
		PluginName:    h.opts.PluginName,
		FailOpen:      h.opts.FailOpen,
		UptimeSeconds: st.Uptime.Seconds(),
		StartedAt:     h.start.UTC(),
		Requests:      st.Requests,
		VMRestarts:    st.VMRestarts,
		Failed:        st.Failed,
		MemoryLimit:   uint64(h.opts.MemoryLimitPages) * 65536,
		PluginConfig:  string(h.opts.PluginConfig),
	}
	a.SharedData.Keys, a.SharedData.Bytes = st.SharedData.Keys, st.SharedData.Bytes
	for _, w := range st.Workers {
		a.Workers = append(a.Workers, AdminWorkerStatus{ID: w.ID, Healthy: w.Healthy, MemoryBytes: w.MemoryBytes, VMRestarts: w.VMRestarts, Requests: w.Requests, Failed: w.Failed})
	}
	return a
}

// AdminHandler serves /metrics (Prometheus text: the guest's metrics and sluice_host_*),
// /status (AdminStatus as JSON) and /healthz ("ok", or 503 when a worker has no VM).
func (h *Host) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		h.WritePrometheus(w)
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(h.Status())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		for _, ws := range h.Stats().Workers {
			if !ws.Healthy {
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write([]byte("unhealthy: a worker has no VM\n"))
				return
			}
		}
		select {
		case <-h.closed:
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("closed\n"))
			return
		default:
		}
		w.Write([]byte("ok\n"))
	})
	return mux
}
