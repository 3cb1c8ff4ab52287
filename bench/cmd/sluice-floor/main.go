// Command sluice-floor measures what any host running a standard-Go Proxy-Wasm module on
// wazero costs at least: a minimal host that links nothing but wazero, compiles the module
// with the settings `sluice run` uses (the optimizing compiler, no compilation cache,
// functions compiled on every CPU), instantiates it once per worker in parallel, calls each
// instance's _initialize, and idles. Its figures are the floor under `sluice run`'s start-up
// and idle memory (bench/cmd/sluice-startup):
//
//	sluice-floor [-wasm dist/sluice.wasm[,other.wasm...]] [-workers 2] [-rounds 3] [-idle 2s] [-mmap]
//
// Each round starts this program again as a child per module (interleaved), and reads from
// /proc the wall and CPU time from the child's start until its instances are initialized,
// then after -idle its VmRSS split into file-backed pages (the binary), anonymous pages and,
// of those, executable ones (the compiled machine code); the child then reports its Go heap
// live after a forced collection. The env imports are stubs answering 0 (nothing calls them
// in _initialize); WASI is wazero's. -mmap gives each instance's linear memory to an
// allocator that reserves the maximum with mmap (pages resident only once touched) instead
// of a Go slice.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/sluice-proxy/sluice/bench/startup"
)

func main() {
	wasms := flag.String("wasm", "dist/sluice.wasm", "modules to measure, comma-separated")
	workers := flag.Int("workers", 2, "instances (one per worker in sluice run)")
	rounds := flag.Int("rounds", 3, "rounds; the summary is their median")
	idle := flag.Duration("idle", 2*time.Second, "idle time after the instances are initialized before memory is read")
	useMmap := flag.Bool("mmap", false, "back linear memories with mmap reservations instead of Go slices")
	child := flag.Bool("child", false, "(internal) be the measured host")
	flag.StringVar(&memProfile, "memprofile", "", "the child writes a heap profile (live objects after a collection) to this file; with one module and one round")
	flag.Parse()
	if *child {
		if err := runChild(*wasms, *workers, *useMmap); err != nil {
			fmt.Fprintln(os.Stderr, "sluice-floor child:", err)
			os.Exit(1)
		}
		return
	}
	mods := strings.Split(*wasms, ",")
	samples := make([][]sample, len(mods))
	for r := 1; r <= *rounds; r++ {
		for i, w := range mods {
			s, err := measure(w, *workers, *idle, *useMmap)
			if err != nil {
				fmt.Fprintf(os.Stderr, "sluice-floor: %s round %d: %v\n", w, r, err)
				os.Exit(1)
			}
			fmt.Printf("%s round %d: %s\n", w, r, s)
			samples[i] = append(samples[i], s)
		}
	}
	for i, w := range mods {
		fmt.Printf("%s: median of %d, %d instances, mmap %v: %s\n", w, *rounds, *workers, *useMmap, median(samples[i]))
	}
}

var memProfile string

// sample is one child's figures.
type sample struct {
	wall, cpu     time.Duration // from the child's start until its instances were initialized
	compile, inst time.Duration // the child's own timing of CompileModule and of instantiate+_initialize
	mem           startup.Mem   // after the idle time
	heapLive      uint64        // Go heap live after a forced collection (bytes)
	heapSys       uint64        // Go heap obtained from the OS (bytes)
	codeBytes     int           // the module's code section (bytes)
}

func (s sample) String() string {
	return fmt.Sprintf("initialized after %v wall, %v CPU (compile %v, instantiate+_initialize %v; %.2f MB of code); idle %s; Go heap live %.1f MB (heap from the OS %.1f MB)",
		s.wall.Round(time.Millisecond), s.cpu, s.compile.Round(time.Millisecond), s.inst.Round(time.Millisecond), float64(s.codeBytes)/1e6,
		s.mem, float64(s.heapLive)/(1<<20), float64(s.heapSys)/(1<<20))
}

// median takes each figure's median over the rounds (the rounds' spread is printed per round).
func median(ss []sample) sample {
	pick := func(f func(sample) int64) int64 {
		v := make([]int64, len(ss))
		for i, s := range ss {
			v[i] = f(s)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return sample{
		wall:      time.Duration(pick(func(s sample) int64 { return int64(s.wall) })),
		cpu:       time.Duration(pick(func(s sample) int64 { return int64(s.cpu) })),
		compile:   time.Duration(pick(func(s sample) int64 { return int64(s.compile) })),
		inst:      time.Duration(pick(func(s sample) int64 { return int64(s.inst) })),
		codeBytes: int(pick(func(s sample) int64 { return int64(s.codeBytes) })),
		mem: startup.Mem{
			RSS:      int(pick(func(s sample) int64 { return int64(s.mem.RSS) })),
			File:     int(pick(func(s sample) int64 { return int64(s.mem.File) })),
			Anon:     int(pick(func(s sample) int64 { return int64(s.mem.Anon) })),
			AnonExec: int(pick(func(s sample) int64 { return int64(s.mem.AnonExec) })),
		},
		heapLive: uint64(pick(func(s sample) int64 { return int64(s.heapLive) })),
		heapSys:  uint64(pick(func(s sample) int64 { return int64(s.heapSys) })),
	}
}

// measure runs one child for the module and reads its figures.
func measure(wasm string, workers int, idle time.Duration, useMmap bool) (sample, error) {
	var s sample
	self, err := os.Executable()
	if err != nil {
		return s, err
	}
	args := []string{"-child", "-wasm", wasm, "-workers", strconv.Itoa(workers)}
	if useMmap {
		args = append(args, "-mmap")
	}
	if memProfile != "" {
		args = append(args, "-memprofile", memProfile)
	}
	cmd := exec.Command(self, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return s, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return s, err
	}
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return s, err
	}
	defer cmd.Wait()
	defer stdin.Close()
	lines := bufio.NewScanner(stdout)
	next := func(prefix string) (string, error) {
		if !lines.Scan() {
			return "", fmt.Errorf("the child ended before %q", prefix)
		}
		rest, ok := strings.CutPrefix(lines.Text(), prefix)
		if !ok {
			return "", fmt.Errorf("the child said %q, want %q", lines.Text(), prefix)
		}
		return rest, nil
	}
	ready, err := next("ready ")
	if err != nil {
		return s, err
	}
	s.wall = time.Since(start)
	if s.cpu, err = startup.CPUTime(cmd.Process.Pid); err != nil {
		return s, err
	}
	if _, err := fmt.Sscan(ready, &s.compile, &s.inst, &s.codeBytes); err != nil {
		return s, fmt.Errorf("child's ready line %q: %v", ready, err)
	}
	time.Sleep(idle)
	if s.mem, err = startup.ReadMem(cmd.Process.Pid); err != nil {
		return s, err
	}
	io.WriteString(stdin, "heap\n")
	heap, err := next("heap ")
	if err != nil {
		return s, err
	}
	_, err = fmt.Sscan(heap, &s.heapLive, &s.heapSys)
	return s, err
}

// runChild is the measured host: compile, instantiate workers instances in parallel, call
// their _initialize, say "ready", give the start-up garbage back to the OS (as sluice run
// does), and on a line from stdin report the heap live after a collection.
func runChild(path string, workers int, useMmap bool) error {
	if memProfile != "" {
		runtime.MemProfileRate = 4096
	}
	ctx := context.Background()
	wasm, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	t0 := time.Now()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithMemoryLimitPages(4096))
	compiled, err := rt.CompileModule(experimental.WithCompilationWorkers(ctx, runtime.GOMAXPROCS(0)), wasm)
	if err != nil {
		return err
	}
	compile := time.Since(t0)
	codeBytes := codeSectionSize(wasm)
	wasm = nil
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		return err
	}
	env := rt.NewHostModuleBuilder("env")
	for _, imp := range compiled.ImportedFunctions() {
		mod, name, _ := imp.Import()
		if mod != "env" {
			continue
		}
		env.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, stack []uint64) {
			clear(stack)
		}), imp.ParamTypes(), imp.ResultTypes()).Export(name)
	}
	if _, err := env.Instantiate(ctx); err != nil {
		return err
	}
	t1 := time.Now()
	mods := make([]api.Module, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ictx := ctx
			if useMmap {
				ictx = experimental.WithMemoryAllocator(ctx, experimental.MemoryAllocatorFunc(newMmapMemory))
			}
			mc := wazero.NewModuleConfig().WithName(fmt.Sprintf("w%d", i)).WithStartFunctions().
				WithSysWalltime().WithSysNanotime().WithSysNanosleep().WithArgs("sluice")
			m, err := rt.InstantiateModule(ictx, compiled, mc)
			if err != nil {
				errs[i] = err
				return
			}
			mods[i] = m
			if f := m.ExportedFunction("_initialize"); f != nil {
				_, errs[i] = f.Call(ctx)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	fmt.Printf("ready %d %d %d\n", compile, time.Since(t1), codeBytes)
	debug.FreeOSMemory()
	in := bufio.NewScanner(os.Stdin)
	in.Scan()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Printf("heap %d %d\n", ms.HeapAlloc, ms.HeapSys-ms.HeapReleased)
	if memProfile != "" {
		f, err := os.Create(memProfile)
		if err != nil {
			return err
		}
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	runtime.KeepAlive(mods)
	return rt.Close(ctx)
}

// codeSectionSize returns the size of the module's code section (id 10), 0 if it cannot tell.
func codeSectionSize(b []byte) int {
	if len(b) < 8 {
		return 0
	}
	for i := 8; i < len(b); {
		id := b[i]
		i++
		n, k := uleb(b[i:])
		if k == 0 {
			return 0
		}
		i += k
		if id == 10 {
			return int(n)
		}
		i += int(n)
	}
	return 0
}

func uleb(b []byte) (uint64, int) {
	var v uint64
	for i, c := range b {
		if i == 10 {
			return 0, 0
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v, i + 1
		}
	}
	return 0, 0
}

// mmapMemory is a linear memory in an mmap reservation of its maximum size: the kernel
// maps a page when it is first touched, and growing never copies.
type mmapMemory struct {
	buf []byte
}

func newMmapMemory(_, max uint64) experimental.LinearMemory {
	b, err := syscall.Mmap(-1, 0, int(max), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		panic(fmt.Sprintf("sluice-floor: reserving %d bytes of linear memory: %v", max, err))
	}
	return &mmapMemory{buf: b[:0]}
}

func (m *mmapMemory) Reallocate(size uint64) []byte {
	if size > uint64(cap(m.buf)) {
		return nil
	}
	m.buf = m.buf[:size]
	return m.buf
}

func (m *mmapMemory) Free() { syscall.Munmap(m.buf[:cap(m.buf)]) }
