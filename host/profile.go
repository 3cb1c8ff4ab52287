package host

import (
	"fmt"
	"sort"
	"strings"
)

// Profile is a named set of proxy-wasm-cpp-host behaviours the host reproduces. Envoy, Istio
// and Higress all link cpp-host; what differs between their releases is which cpp-host
// commit they pin. The strictest profile is the default: a module that survives it survives
// every host we support. host/doc.go names the source of each behaviour.
type Profile struct {
	// Name is what `sluice run --profile` takes.
	Name string
	// Summary is one line for --help and /status.
	Summary string
	// WASI selects the WASI implementation: wasiCppHost427 (cpp-host from PR #427 up to,
	// not including, #533), wasiCppHost533 (from #533), or wasiWazero (wazero's complete
	// WASI, no cpp-host semantics: the permissive profile).
	WASI wasiFlavor
	// InitAllow and AllocAllow are the host functions ("module.name") a guest may call
	// during _initialize and during proxy_on_memory_allocate. nil: no restriction. Any other
	// call traps, as cpp-host's V8 runtime does ("restricted_callback").
	InitAllow, AllocAllow map[string]bool
	// StopIterationVMWide: proxy_send_local_response raises one flag for the whole VM; the
	// return value of the stream callback running at that moment is then converted to
	// StopAllIterationAndWatermark (headers) or StopIterationNoBuffer (body), whichever
	// stream the reply was for. The flag is cleared when any top-level callback returns.
	StopIterationVMWide bool
	// LegacyWasmAttributes: the properties route_name and cluster_name are served besides
	// xds.route_name and xds.cluster_name. Upstream Envoy removed them in 1.33 (its
	// changelogs/1.33.0.yaml, PR #36619); Higress's Envoy keeps them, and its SDKs read them.
	LegacyWasmAttributes bool
}

type wasiFlavor int

const (
	wasiCppHost427 wasiFlavor = iota
	wasiCppHost533
	wasiWazero
)

// DefaultProfile is the strictest profile: the default of New and of `sluice run`.
const DefaultProfile = "envoy-1.33"

func set(names ...string) map[string]bool {
	m := make(map[string]bool, 2*len(names))
	for _, n := range names {
		if strings.Contains(n, ".") {
			m[n] = true
			continue
		}
		// a WASI function: cpp-host allows both module names
		m["wasi_unstable."+n] = true
		m["wasi_snapshot_preview1."+n] = true
	}
	return m
}

// cpp-host before #533: wasm.h WasmBase::startVm and WasmBase::allocMemory.
var (
	initAllow427 = set("env.emscripten_notify_memory_growth", "env.proxy_log", "fd_write",
		"args_sizes_get", "args_get", "environ_sizes_get", "environ_get",
		"fd_prestat_get", "fd_prestat_dir_name", "clock_time_get", "random_get",
		"fd_fdstat_get", "fd_fdstat_set_flags")
	allocAllow427 = set("env.proxy_log", "fd_write", "clock_time_get")

	initAllow533 = set("env.emscripten_notify_memory_growth", "env.proxy_log", "fd_write",
		"args_sizes_get", "args_get", "environ_sizes_get", "environ_get",
		"clock_time_get", "clock_res_get", "random_get", "poll_oneoff",
		"fd_fdstat_get", "fd_fdstat_set_flags",
		"fd_advise", "fd_allocate", "fd_datasync", "fd_fdstat_set_rights", "fd_filestat_get",
		"fd_filestat_set_size", "fd_filestat_set_times", "fd_pread", "fd_prestat_dir_name",
		"fd_prestat_get", "fd_pwrite", "fd_readdir", "fd_renumber", "fd_sync", "fd_tell",
		"path_create_directory", "path_filestat_get", "path_filestat_set_times", "path_link",
		"path_readlink", "path_remove_directory", "path_rename", "path_symlink",
		"path_unlink_file", "sock_accept", "sock_recv", "sock_send", "sock_shutdown")
	allocAllow533 = set("env.proxy_log", "fd_write", "clock_time_get", "poll_oneoff")
)

var profiles = []Profile{
	{
		Name:                DefaultProfile,
		Summary:             "strictest: cpp-host #427 up to #533 (Envoy 1.33–1.38, Istio 1.25–1.30): poll_oneoff ENOSYS, restricted _initialize and proxy_on_memory_allocate",
		WASI:                wasiCppHost427,
		InitAllow:           initAllow427,
		AllocAllow:          allocAllow427,
		StopIterationVMWide: true,
	},
	{
		Name:                "cpphost-533",
		Summary:             "cpp-host with #533 (Envoy ≥ 1.39, Istio ≥ 1.31): poll_oneoff returns 0, allowed while allocating",
		WASI:                wasiCppHost533,
		InitAllow:           initAllow533,
		AllocAllow:          allocAllow533,
		StopIterationVMWide: true,
	},
	{
		Name:                "higress",
		Summary:             "Higress ≥ 2.1.2 (its cpp-host fork): WASI as with #533, no restriction inside proxy_on_memory_allocate; Redis host calls from the redis extension",
		WASI:                wasiCppHost533,
		InitAllow:           initAllow533,
		AllocAllow:          nil,
		StopIterationVMWide: true,
		// higress-group/envoy, source/extensions/common/wasm/context.cc
		// (Context::findValue, PropertyToken::ROUTE_NAME / CLUSTER_NAME).
		LegacyWasmAttributes: true,
	},
	{
		Name:                 "permissive",
		Summary:              "not a real host: wazero's full WASI, no call restrictions, per-stream local replies (for comparison only)",
		WASI:                 wasiWazero,
		LegacyWasmAttributes: true,
	},
}

// Profiles lists the known profiles, strictest first.
func Profiles() []Profile { return append([]Profile(nil), profiles...) }

// LookupProfile returns the profile called name ("" = DefaultProfile).
func LookupProfile(name string) (Profile, error) {
	if name == "" {
		name = DefaultProfile
	}
	for _, p := range profiles {
		if p.Name == name {
			return p, nil
		}
	}
	names := make([]string, len(profiles))
	for i, p := range profiles {
		names[i] = p.Name
	}
	sort.Strings(names)
	return Profile{}, fmt.Errorf("host: unknown profile %q (known: %s)", name, strings.Join(names, ", "))
}
