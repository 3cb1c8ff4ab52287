package host

import (
	"bytes"
	"time"
)

// Snapshot is the Host's state at one instant, as Go values. The admin server renders one
// per request — /metrics (WritePrometheus), /status (Status), /healthz — and the dashboard
// of `sluice run` reads them in process: one source for all three. A Snapshot shares
// nothing mutable with the Host; its configuration bytes must not be modified.
type Snapshot struct {
	Stats Stats
	// Closed is true once Close has been called.
	Closed    bool
	StartedAt time.Time
	// The options the Host runs with.
	VMID, RootID, PluginName string
	FailOpen                 bool
	FailurePolicy            FailurePolicy
	MemoryLimitBytes         uint64
	// Plugins holds, per plugin (Plugins[i].Plugin == i), the configurations in force.
	Plugins []Plugin
	// Metrics are the guest's metrics, sorted by Name, with their Prometheus names.
	Metrics []Metric
	// TopKeys are the filter's top-keys summaries in shared data (topkeys.go).
	TopKeys []TopKeys
}

// Plugin is the state of one plugin of the module (Options.PluginConfig is plugin 0,
// Options.MorePlugins the others).
type Plugin struct {
	Plugin int
	// Configs are the configurations in force on the workers, ordered by the first worker
	// each is in force on: one entry, unless a Reconfigure was refused by some workers
	// and not others (or reached a worker that had no VM).
	Configs []PluginConfig
}

// PluginConfig is a configuration and the workers it is in force on.
type PluginConfig struct {
	Config  []byte
	Workers []int
}

// Config returns the configuration in force on the first worker (on every worker, unless
// Configs says otherwise).
func (p Plugin) Config() []byte {
	if len(p.Configs) == 0 {
		return nil
	}
	return p.Configs[0].Config
}

// Snapshot returns the Host's state now; safe to call at any time, from any goroutine,
// also after Close. It does not wait for the workers.
func (h *Host) Snapshot() Snapshot {
	s := Snapshot{
		Stats:            h.Stats(),
		StartedAt:        h.start,
		VMID:             h.opts.VMID,
		RootID:           h.opts.RootID,
		PluginName:       h.opts.PluginName,
		FailOpen:         h.opts.FailOpen,
		FailurePolicy:    h.opts.FailurePolicy,
		MemoryLimitBytes: uint64(h.opts.MemoryLimitPages) * 65536,
		Metrics:          h.Metrics(),
		TopKeys:          topKeysOf(h.shared),
	}
	select {
	case <-h.stopping:
		s.Closed = true
	default:
	}
	initial := append([][]byte{h.opts.PluginConfig}, h.opts.MorePlugins...)
	s.Plugins = make([]Plugin, h.plugins)
	for p := range s.Plugins {
		s.Plugins[p].Plugin = p
	}
	for _, w := range h.workers {
		configs := initial
		if c := w.inForce.Load(); c != nil {
			configs = *c
		}
		for p := range s.Plugins {
			s.Plugins[p].add(w.id, configs[p])
		}
	}
	return s
}

func (p *Plugin) add(worker int, config []byte) {
	for i := range p.Configs {
		if bytes.Equal(p.Configs[i].Config, config) {
			p.Configs[i].Workers = append(p.Configs[i].Workers, worker)
			return
		}
	}
	p.Configs = append(p.Configs, PluginConfig{Config: config, Workers: []int{worker}})
}

// setConfig records config as plugin's configuration in force on w. It runs on the
// worker; the list is copied on write and published for Snapshot, which reads it from
// other goroutines.
func (w *worker) setConfig(plugin int, config []byte) {
	c := append([][]byte(nil), w.configs...)
	c[plugin] = config
	w.configs = c
	w.inForce.Store(&c)
}
