package main

import (
	"context"
	"net/http"

	"github.com/sluice-proxy/sluice/cmd/sluice/internal/dashboard"
	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/host"
)

// The live dashboard of `sluice run --admin ADDR`, at /dashboard/ on the admin server. It
// takes the host's snapshot (the one /metrics and /status render) in process once a
// second and keeps ten minutes of samples; see package dashboard. The filter's metrics get
// their # HELP texts from filter.MetricHelp, next to the metric names.
func init() {
	runHooks = append(runHooks, runHook{apply: func(opts *host.Options) (func(), error) {
		opts.MetricHelp = filter.MetricHelp
		return nil, nil
	}})
	adminRoutes = append(adminRoutes, mountDashboard)
}

func mountDashboard(mux *http.ServeMux, h *host.Host) {
	d := dashboard.New(h, dashboard.Options{})
	// Run stops by itself when the host is closed (its snapshot says so).
	go d.Run(context.Background())
	mux.Handle("/dashboard/", http.StripPrefix("/dashboard", d.Handler()))
}
