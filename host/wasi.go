package host

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// WASI as proxy-wasm-cpp-host implements it (src/exports.cc, the wasi_unstable_* functions;
// registered under both "wasi_unstable" and "wasi_snapshot_preview1" by WasmBase::
// registerCallbacks in src/wasm.cc). Before PR #533 cpp-host registers the eighteen
// functions of FOR_ALL_WASI_FUNCTIONS (include/proxy-wasm/exports.h) as of PR #427; #533
// adds the rest of preview 1 and makes poll_oneoff succeed. A module importing a function
// the profile does not register fails to instantiate, as it fails to link in cpp-host.

// WASI errno values used below.
const (
	errnoSuccess  = 0
	errnoBadf     = 8
	errnoFault    = 21
	errnoInval    = 28
	errnoNoent    = 44
	errnoNosys    = 52
	errnoNotdir   = 20
	errnoNotsup   = 58
	randomGetMax  = 64 << 10 // PROXY_WASM_HOST_WASI_RANDOM_GET_MAX_SIZE_BYTES (limits.h)
	wasiPreview1  = "wasi_snapshot_preview1"
	wasiUnstable  = "wasi_unstable"
	clockRealtime = 0
	clockMonotone = 1
)

// errRestricted is the trap of a host call made where cpp-host forbids it.
type errRestricted struct{ name, during string }

func (e errRestricted) Error() string {
	return fmt.Sprintf("restricted_callback: %s called during %s (cpp-host traps: the call is not on its allow-list)", e.name, e.during)
}

// errProcExit ends the VM: cpp-host's proc_exit only logs, and a Go runtime that asked to
// exit (a fatal error: "poll_oneoff failed", out of memory, …) cannot go on afterwards.
type errProcExit struct{ code uint32 }

func (e errProcExit) Error() string { return fmt.Sprintf("guest called proc_exit(%d)", e.code) }

// checkAllowed traps the calling guest when a restricted callback is running and name is not
// on its allow-list.
func (v *vm) checkAllowed(name string) {
	if v.allow != nil && !v.allow[name] {
		v.h.restrictedTraps.Add(1)
		panic(errRestricted{name: name, during: v.restrictedDuring})
	}
}

// restrict runs f with the allow-list of a restricted callback (nil allow: no restriction).
func (v *vm) restrict(allow map[string]bool, during string, f func()) {
	prevAllow, prevDuring := v.allow, v.restrictedDuring
	v.allow, v.restrictedDuring = allow, during
	defer func() { v.allow, v.restrictedDuring = prevAllow, prevDuring }()
	f()
}

type wasiFunc struct {
	name            string
	params, results []api.ValueType
	fn              func(v *vm, s []uint64) uint32
	since533        bool
}

func errnoConst(e uint32) func(*vm, []uint64) uint32 { return func(*vm, []uint64) uint32 { return e } }

// onlyStdio is cpp-host #533's answer for fd operations that make no sense on a log: success
// on stdout/stderr, BADF elsewhere.
func onlyStdio(v *vm, s []uint64) uint32 {
	if fd := u32(s[0]); fd != 1 && fd != 2 {
		return errnoBadf
	}
	return errnoSuccess
}

func (v *vm) setWord(ptr, val uint32) uint32 {
	if !v.writeU32(ptr, val) {
		return errnoFault
	}
	return errnoSuccess
}

// wasiFunctions is every function cpp-host registers, in its latest version; each flavour
// takes its subset (wasiFor).
var wasiFunctions = wasiFuncs()

// wasiFor returns the WASI functions cpp-host registers in that flavour.
func wasiFor(flavor wasiFlavor) []wasiFunc {
	var fs []wasiFunc
	for _, f := range wasiFunctions {
		if !f.since533 || flavor != wasiCppHost427 {
			fs = append(fs, f)
		}
	}
	return fs
}

// wasiFuncs is the table of the WASI functions the host provides, one entry per
// function with its signature and its behaviour as Envoy's hosts give it. It is long
// because it is a table: an entry per function, read and compared line by line with
// the hosts' own lists, not a sequence of steps.
func wasiFuncs() []wasiFunc {
	w := func(n int) []api.ValueType { return sig(n) }
	r := []api.ValueType{i32}
	p := func(ts ...api.ValueType) []api.ValueType { return ts }
	return []wasiFunc{
		{name: "fd_write", params: w(4), results: r, fn: wasiFdWrite},
		{name: "fd_read", params: w(4), results: r, fn: errnoConst(errnoNosys)},
		{name: "fd_seek", params: p(i32, i64, i32, i32), results: r, fn: func(v *vm, _ []uint64) uint32 {
			v.log.Error("wasi_unstable fd_seek")
			return errnoSuccess
		}},
		{name: "fd_close", params: w(1), results: r, fn: func(v *vm, _ []uint64) uint32 {
			v.log.Error("wasi_unstable fd_close")
			return errnoSuccess
		}},
		{name: "fd_fdstat_get", params: w(2), results: r, fn: wasiFdFdstatGet},
		{name: "fd_fdstat_set_flags", params: w(2), results: r, fn: errnoConst(errnoNosys)},
		{name: "environ_get", params: w(2), results: r, fn: errnoConst(errnoSuccess)},
		{name: "environ_sizes_get", params: w(2), results: r, fn: func(v *vm, s []uint64) uint32 {
			if e := v.setWord(u32(s[0]), 0); e != 0 {
				return e
			}
			return v.setWord(u32(s[1]), 0)
		}},
		{name: "args_get", params: w(2), results: r, fn: errnoConst(errnoSuccess)},
		{name: "args_sizes_get", params: w(2), results: r, fn: func(v *vm, s []uint64) uint32 {
			if e := v.setWord(u32(s[0]), 0); e != 0 {
				return e
			}
			return v.setWord(u32(s[1]), 0)
		}},
		{name: "clock_time_get", params: p(i32, i64, i32), results: r, fn: wasiClockTimeGet},
		{name: "random_get", params: w(2), results: r, fn: wasiRandomGet},
		{name: "sched_yield", params: nil, results: r, fn: errnoConst(errnoSuccess)},
		{name: "poll_oneoff", params: w(4), results: r, fn: wasiPollOneoff},
		{name: "proc_exit", params: w(1), results: nil, fn: func(v *vm, s []uint64) uint32 {
			v.log.Error("wasi_unstable proc_exit", "code", u32(s[0]))
			panic(errProcExit{code: u32(s[0])})
		}},
		{name: "path_open", params: p(i32, i32, i32, i32, i32, i64, i64, i32, i32), results: r, fn: errnoConst(errnoNoent)},
		{name: "fd_prestat_get", params: w(2), results: r, fn: errnoConst(errnoBadf)},
		{name: "fd_prestat_dir_name", params: w(3), results: r, fn: errnoConst(errnoNosys)},

		// Added by #533.
		{name: "fd_filestat_get", params: w(2), results: r, fn: errnoConst(errnoBadf), since533: true},
		{name: "path_filestat_get", params: w(5), results: r, fn: errnoConst(errnoNotsup), since533: true},
		{name: "clock_res_get", params: w(2), results: r, fn: func(v *vm, s []uint64) uint32 {
			if id := u32(s[0]); id != clockRealtime && id != clockMonotone {
				return errnoNotsup
			}
			if !v.writeU64(u32(s[1]), 1) {
				return errnoFault
			}
			return errnoSuccess
		}, since533: true},
		{name: "fd_advise", params: p(i32, i64, i64, i32), results: r, fn: errnoConst(errnoSuccess), since533: true},
		{name: "fd_allocate", params: p(i32, i64, i64), results: r, fn: onlyStdio, since533: true},
		{name: "fd_datasync", params: w(1), results: r, fn: onlyStdio, since533: true},
		{name: "fd_fdstat_set_rights", params: p(i32, i64, i64), results: r, fn: onlyStdio, since533: true},
		{name: "fd_filestat_set_size", params: p(i32, i64), results: r, fn: onlyStdio, since533: true},
		{name: "fd_filestat_set_times", params: p(i32, i64, i64, i32), results: r, fn: onlyStdio, since533: true},
		{name: "fd_pread", params: p(i32, i32, i32, i64, i32), results: r, fn: errnoConst(errnoNosys), since533: true},
		{name: "fd_pwrite", params: p(i32, i32, i32, i64, i32), results: r, fn: func(v *vm, s []uint64) uint32 {
			return wasiFdWrite(v, []uint64{s[0], s[1], s[2], s[4]})
		}, since533: true},
		{name: "fd_readdir", params: p(i32, i32, i32, i64, i32), results: r, fn: func(v *vm, s []uint64) uint32 {
			if e := v.setWord(u32(s[4]), 0); e != 0 {
				return e
			}
			return errnoNotdir
		}, since533: true},
		{name: "fd_renumber", params: w(2), results: r, fn: func(v *vm, s []uint64) uint32 {
			if onlyStdio(v, s) != 0 {
				return errnoBadf
			}
			return errnoNotsup
		}, since533: true},
		{name: "fd_sync", params: w(1), results: r, fn: onlyStdio, since533: true},
		{name: "fd_tell", params: w(2), results: r, fn: func(v *vm, s []uint64) uint32 {
			if onlyStdio(v, s) != 0 {
				return errnoBadf
			}
			if !v.writeU64(u32(s[1]), 0) {
				return errnoFault
			}
			return errnoSuccess
		}, since533: true},
		{name: "path_create_directory", params: w(3), results: r, fn: errnoConst(errnoNotsup), since533: true},
		{name: "path_filestat_set_times", params: p(i32, i32, i32, i32, i64, i64, i32), results: r, fn: errnoConst(errnoNotsup), since533: true},
		{name: "path_link", params: w(7), results: r, fn: errnoConst(errnoNotsup), since533: true},
		{name: "path_readlink", params: w(6), results: r, fn: func(v *vm, s []uint64) uint32 {
			if e := v.setWord(u32(s[5]), 0); e != 0 {
				return e
			}
			return errnoNotsup
		}, since533: true},
		{name: "path_remove_directory", params: w(3), results: r, fn: errnoConst(errnoNotsup), since533: true},
		{name: "path_rename", params: w(6), results: r, fn: errnoConst(errnoNotsup), since533: true},
		{name: "path_symlink", params: w(5), results: r, fn: errnoConst(errnoNotsup), since533: true},
		{name: "path_unlink_file", params: w(3), results: r, fn: errnoConst(errnoNotsup), since533: true},
		{name: "sock_accept", params: w(3), results: r, fn: func(v *vm, s []uint64) uint32 {
			if e := v.setWord(u32(s[2]), 0); e != 0 {
				return e
			}
			return errnoNotsup
		}, since533: true},
		{name: "sock_recv", params: w(6), results: r, fn: func(v *vm, s []uint64) uint32 {
			if e := v.setWord(u32(s[4]), 0); e != 0 {
				return e
			}
			if e := v.setWord(u32(s[5]), 0); e != 0 {
				return e
			}
			return errnoNotsup
		}, since533: true},
		{name: "sock_send", params: w(5), results: r, fn: func(v *vm, s []uint64) uint32 {
			if e := v.setWord(u32(s[4]), 0); e != 0 {
				return e
			}
			return errnoNotsup
		}, since533: true},
		{name: "sock_shutdown", params: w(2), results: r, fn: errnoConst(errnoNotsup), since533: true},
	}
}

// wasiFdWrite: stdout → info, stderr → error, one log record per call with a trailing
// newline removed (cpp-host writevImpl); other descriptors → BADF.
func wasiFdWrite(v *vm, s []uint64) uint32 {
	fd, iovs, n, nwritten := u32(s[0]), u32(s[1]), u32(s[2]), u32(s[3])
	var lvl slog.Level
	var stream string
	switch fd {
	case 1:
		lvl, stream = slog.LevelInfo, "guest stdout"
	case 2:
		lvl, stream = slog.LevelError, "guest stderr"
	default:
		return errnoBadf
	}
	var buf []byte
	for i := uint32(0); i < n; i++ {
		vec, ok := v.read(iovs+8*i, 8)
		if !ok {
			return errnoFault
		}
		ptr, size := binary.LittleEndian.Uint32(vec), binary.LittleEndian.Uint32(vec[4:])
		if size == 0 {
			continue
		}
		b, ok := v.read(ptr, size)
		if !ok {
			return errnoFault
		}
		buf = append(buf, b...)
	}
	written := len(buf)
	if written > 0 {
		line := buf
		if line[len(line)-1] == '\n' {
			line = line[:len(line)-1]
		}
		if lvl >= v.h.opts.LogLevel {
			v.log.Log(context.Background(), lvl, stream, "line", string(line), "context", v.curID)
		}
	}
	return v.setWord(nwritten, uint32(written))
}

// wasiFdFdstatGet: stdout and stderr are write-only character-less descriptors (the 24-byte
// fdstat zeroed but for fs_rights_base = FD_WRITE); anything else, stdin included, is BADF.
func wasiFdFdstatGet(v *vm, s []uint64) uint32 {
	fd, out := u32(s[0]), u32(s[1])
	if fd != 1 && fd != 2 {
		return errnoBadf
	}
	var st [24]byte
	st[8] = 64
	if !v.mem.Write(out, st[:]) {
		return errnoFault
	}
	return errnoSuccess
}

// wasiClockTimeGet reads the host's clock (Options.Clock): the realtime clock is its time,
// the monotonic clock the time since the host started on it (plus 1: never 0), so a guest
// sees the time a test steps.
func wasiClockTimeGet(v *vm, s []uint64) uint32 {
	var t uint64
	switch u32(s[0]) {
	case clockRealtime:
		t = uint64(v.h.clock.Now().UnixNano())
	case clockMonotone:
		t = uint64(v.h.clock.Now().Sub(v.h.monoBase)) + 1
	default:
		return errnoNotsup
	}
	if !v.writeU64(u32(s[2]), t) {
		return errnoFault
	}
	return errnoSuccess
}

func wasiRandomGet(v *vm, s []uint64) uint32 {
	ptr, n := u32(s[0]), u32(s[1])
	if n > randomGetMax {
		return errnoInval
	}
	if n == 0 {
		return errnoSuccess
	}
	b, ok := v.read(ptr, n)
	if !ok {
		return errnoFault
	}
	if _, err := rand.Read(b); err != nil {
		return errnoFault
	}
	return errnoSuccess
}

// wasiPollOneoff: ENOSYS before #533 (the Go runtime throws "poll_oneoff failed" on it);
// from #533, no events and success, without waiting.
func wasiPollOneoff(v *vm, s []uint64) uint32 {
	v.h.pollOneoffCalls.Add(1)
	if v.h.profile.WASI == wasiCppHost427 {
		return errnoNosys
	}
	return v.setWord(u32(s[3]), 0)
}

// instantiateWASI builds the WASI host modules of the profile.
func (h *Host) instantiateWASI(ctx context.Context) error {
	if h.profile.WASI == wasiWazero {
		_, err := wasi_snapshot_preview1.Instantiate(ctx, h.rt)
		return err
	}
	for _, modName := range []string{wasiPreview1, wasiUnstable} {
		b := h.rt.NewHostModuleBuilder(modName)
		for _, f := range wasiFor(h.profile.WASI) {
			f := f
			qualified := modName + "." + f.name
			b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, stack []uint64) {
				v := vmFrom(ctx)
				v.checkAllowed(qualified)
				e := f.fn(v, stack)
				if len(f.results) > 0 {
					stack[0] = uint64(e)
				}
			}), f.params, f.results).Export(f.name)
		}
		if _, err := b.Instantiate(ctx); err != nil {
			return fmt.Errorf("host: %s module: %w", modName, err)
		}
	}
	return nil
}

// missingImports lists the functions a module imports from WASI that the profile does not
// register (cpp-host refuses to link such a module).
func (h *Host) missingImports(compiled wazero.CompiledModule) []string {
	if h.profile.WASI == wasiWazero {
		return nil
	}
	have := map[string]bool{}
	for _, f := range wasiFor(h.profile.WASI) {
		have[f.name] = true
	}
	var missing []string
	for _, imp := range compiled.ImportedFunctions() {
		mod, name, _ := imp.Import()
		if (mod == wasiPreview1 || mod == wasiUnstable) && !have[name] {
			missing = append(missing, mod+"."+name)
		}
	}
	return missing
}

var errMissingImport = errors.New("host: the module imports WASI functions this profile's cpp-host does not provide")
