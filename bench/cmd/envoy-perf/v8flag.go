package main

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// enableV8Flag copies the Envoy binary src to dst with the V8 boolean flag name (as V8
// spells it in its flag table, underscores: "perf_basic_prof") set to true.
//
// Envoy passes V8 no flags of its own (proxy-wasm-cpp-host sets a fixed few with
// SetFlagsFromString when it makes the engine) and has no option, runtime key or
// environment variable for more. But V8's flag values are one statically initialised
// struct in .data, and its flag table (in .data.rel.ro) holds, per flag, a pointer to the
// name, then a pointer to the value: in a position-independent executable both are
// R_X86_64_RELATIVE relocations whose addends are the addresses, so the value's address is
// found from the name without a symbol table (release builds are stripped), and its
// initial byte is changed in the copy. Nothing else in the binary changes, and the value
// V8 reads when it initialises is the same it would have read from --perf-basic-prof.
func enableV8Flag(src, dst, name string) error {
	f, err := elf.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 || f.Class != elf.ELFCLASS64 {
		return fmt.Errorf("%s: only x86-64 ELF binaries are handled", src)
	}
	strAddr, err := findString(f, name)
	if err != nil {
		return err
	}
	rel, err := relativeRelocs(f)
	if err != nil {
		return err
	}
	var val uint64
	for off, add := range rel {
		if add != strAddr {
			continue
		}
		// name_ at off, valptr_ at off+8 (both relocated pointers in the flag entry).
		v, ok := rel[off+8]
		if !ok {
			continue
		}
		if val != 0 && val != v {
			return fmt.Errorf("%s: two flag entries name %q", src, name)
		}
		val = v
	}
	if val == 0 {
		return fmt.Errorf("%s: no V8 flag entry names %q", src, name)
	}
	fileOff, err := fileOffset(f, val)
	if err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	var cur [1]byte
	if _, err := in.ReadAt(cur[:], fileOff); err != nil {
		return err
	}
	if cur[0] > 1 {
		return fmt.Errorf("%s: the value of %q at %#x is %#x, not a bool", src, name, val, cur[0])
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if _, err := out.WriteAt([]byte{1}, fileOff); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// findString is the address of the NUL-terminated string s in .rodata (starting a string).
func findString(f *elf.File, s string) (uint64, error) {
	ro := f.Section(".rodata")
	if ro == nil {
		return 0, errors.New("no .rodata section")
	}
	data, err := ro.Data()
	if err != nil {
		return 0, err
	}
	want := append([]byte(s), 0)
	for i := 0; ; {
		n := bytes.Index(data[i:], want)
		if n < 0 {
			return 0, fmt.Errorf("no string %q in .rodata", s)
		}
		i += n
		if i == 0 || data[i-1] == 0 {
			return ro.Addr + uint64(i), nil
		}
		i++
	}
}

// relativeRelocs maps the offset of every R_X86_64_RELATIVE relocation in .rela.dyn to
// its addend.
func relativeRelocs(f *elf.File) (map[uint64]uint64, error) {
	s := f.Section(".rela.dyn")
	if s == nil {
		return nil, errors.New("no .rela.dyn section (not a position-independent executable?)")
	}
	data, err := s.Data()
	if err != nil {
		return nil, err
	}
	m := make(map[uint64]uint64, len(data)/24)
	for i := 0; i+24 <= len(data); i += 24 {
		info := binary.LittleEndian.Uint64(data[i+8:])
		if elf.R_X86_64(info&0xffffffff) != elf.R_X86_64_RELATIVE {
			continue
		}
		m[binary.LittleEndian.Uint64(data[i:])] = binary.LittleEndian.Uint64(data[i+16:])
	}
	return m, nil
}

// fileOffset is where the initial content of the address addr is in the file.
func fileOffset(f *elf.File, addr uint64) (int64, error) {
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && addr >= p.Vaddr && addr < p.Vaddr+p.Filesz {
			return int64(p.Off + addr - p.Vaddr), nil
		}
	}
	return 0, fmt.Errorf("address %#x is not in the file's loaded segments", addr)
}
