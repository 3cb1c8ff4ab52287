package main

import (
	"context"
	"net/http"

	"github.com/sluice-proxy/sluice/host"
	"github.com/sluice-proxy/sluice/internal/dashboard"
)

// The live dashboard of `sluice run --admin ADDR`, at /dashboard/ on the admin server. It
// reads the host's own /metrics and /status (in process, through the admin handler) once
// a second and keeps ten minutes of samples; see package dashboard.
func init() {
	adminRoutes = append(adminRoutes, mountDashboard)
}

func mountDashboard(mux *http.ServeMux, h *host.Host) {
	d := dashboard.New(dashboard.AdminSource(h.AdminHandler()), dashboard.Options{})
	// Run stops by itself when the host is closed (the admin handler's /healthz says so).
	go d.Run(context.Background())
	mux.Handle("/dashboard/", http.StripPrefix("/dashboard", d.Handler()))
}
