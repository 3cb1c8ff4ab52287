package wasmpatch

import (
	"cmp"
	"errors"
	"slices"
)

// joinDataGap is the largest run of zero bytes between two active data segments that
// JoinDataSegments fills to join them.
const joinDataGap = 64

// JoinDataSegments returns mod with its active data segments joined wherever they are at
// most joinDataGap bytes apart, the gaps filled with the zeros a fresh memory holds there,
// so instantiating it writes the same bytes into memory. Go's linker writes its data as tens
// of thousands of segments of a few bytes (sluice.wasm: 43,189, median 2 bytes), and wazero
// keeps a decoded record of each for the module's life and a slice header per segment in
// every instance (several MB of Go heap). ok is false, and mod is to be used as it is, when
// the module is not in the shape this handles: a data count section (bulk memory may name
// segments by index), a passive segment or one for another memory, an offset that is not a
// constant, or overlapping segments.
func JoinDataSegments(mod []byte) (out []byte, ok bool) {
	if len(mod) < 8 || string(mod[:4]) != "\x00asm" {
		return mod, false
	}
	var dataStart, dataEnd int // the data section, header included
	var body []byte
	for i := 8; i < len(mod); {
		start := i
		id := mod[i]
		n, k, err := readU32(mod[i+1:])
		if err != nil || i+1+k+int(n) > len(mod) {
			return mod, false
		}
		i += 1 + k
		switch id {
		case 12: // data count
			return mod, false
		case 11:
			dataStart, dataEnd, body = start, i+int(n), mod[i:i+int(n)]
		}
		i += int(n)
	}
	if body == nil {
		return mod, false
	}
	segs, err := readDataSegments(body)
	if err != nil || len(segs) < 2 {
		return mod, false
	}
	// Go writes its sections' segments out of address order. Segments that do not overlap
	// write the same memory in any order, so they are joined in address order.
	slices.SortStableFunc(segs, func(a, b dataSegment) int { return cmp.Compare(a.offset, b.offset) })
	var merged []dataSegment
	for _, s := range segs {
		if last := len(merged) - 1; last >= 0 {
			end := uint64(merged[last].offset) + uint64(len(merged[last].init))
			if uint64(s.offset) < end {
				return mod, false // overlapping: which wins depends on the order; leave the module alone
			}
			if gap := uint64(s.offset) - end; gap <= joinDataGap {
				m := &merged[last]
				m.init = append(append(m.init, make([]byte, gap)...), s.init...)
				continue
			}
		}
		merged = append(merged, dataSegment{offset: s.offset, init: append([]byte(nil), s.init...)})
	}
	sec := appendU32(nil, uint32(len(merged)))
	for _, s := range merged {
		sec = append(sec, 0, 0x41) // active, memory 0; offset: i32.const
		sec = appendS32(sec, int32(s.offset))
		sec = append(sec, 0x0b) // end
		sec = appendU32(sec, uint32(len(s.init)))
		sec = append(sec, s.init...)
	}
	out = make([]byte, 0, len(mod)-len(body)+len(sec))
	out = append(out, mod[:dataStart]...)
	out = append(out, 11)
	out = appendU32(out, uint32(len(sec)))
	out = append(out, sec...)
	out = append(out, mod[dataEnd:]...)
	return out, true
}

type dataSegment struct {
	offset uint32
	init   []byte
}

var errDataShape = errors.New("data segment not active on memory 0 at a constant offset")

// readDataSegments decodes a data section of active segments on memory 0 with i32.const
// offsets; anything else is errDataShape.
func readDataSegments(b []byte) ([]dataSegment, error) {
	count, k, err := readU32(b)
	if err != nil {
		return nil, err
	}
	b = b[k:]
	segs := make([]dataSegment, 0, count)
	for range count {
		if len(b) < 2 || b[0] != 0 || b[1] != 0x41 {
			return nil, errDataShape
		}
		off, k, err := readS32(b[2:])
		if err != nil || off < 0 {
			return nil, errDataShape
		}
		b = b[2+k:]
		if len(b) < 1 || b[0] != 0x0b {
			return nil, errDataShape
		}
		n, k, err := readU32(b[1:])
		if err != nil || 1+k+int(n) > len(b) {
			return nil, errDataShape
		}
		segs = append(segs, dataSegment{offset: uint32(off), init: b[1+k : 1+k+int(n)]})
		b = b[1+k+int(n):]
	}
	if len(b) != 0 {
		return nil, errDataShape
	}
	return segs, nil
}

var errLEB = errors.New("bad LEB128")

// readU32 is readULEB held to a u32's encoding: at most 5 bytes, a value below 2^32.
func readU32(b []byte) (uint32, int, error) {
	v, k, err := readULEB(b)
	if err != nil || k > 5 || v > 1<<32-1 {
		return 0, 0, errLEB
	}
	return uint32(v), k, nil
}

func readS32(b []byte) (int32, int, error) {
	var v int64
	for i := 0; i < len(b) && i < 5; i++ {
		v |= int64(b[i]&0x7f) << (7 * i)
		if b[i] < 0x80 {
			if shift := 7 * (i + 1); shift < 64 && b[i]&0x40 != 0 {
				v |= -1 << shift
			}
			if v < -1<<31 || v > 1<<31-1 {
				return 0, 0, errLEB
			}
			return int32(v), i + 1, nil
		}
	}
	return 0, 0, errLEB
}

func appendU32(b []byte, v uint32) []byte { return uleb(b, uint64(v)) }

func appendS32(b []byte, v int32) []byte {
	x := int64(v)
	for {
		c := byte(x & 0x7f)
		x >>= 7
		if (x == 0 && c&0x40 == 0) || (x == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}
