package usage

import "errors"

// Bounds of a compiled path set. They size fixed arrays in Extractor, so an
// Extractor never grows.
const (
	// MaxPaths is the most paths one Paths may hold (one bit each in a uint32).
	MaxPaths = 32
	// MaxSegments is the most dot-separated keys in one path.
	MaxSegments = 8
	// MaxSegmentLen is the longest key, in bytes, a path may name. Longer keys
	// in a document are still read (in O(1) state) but can match nothing.
	MaxSegmentLen = 64
)

// Paths is a compiled, immutable set of dotted paths. One Paths may be shared
// by any number of Extractors.
type Paths struct {
	n    int
	segs [MaxPaths][MaxSegments]string
	nseg [MaxPaths]uint8
	// leaf[k] has bit i set when path i has exactly k+1 segments, so the value
	// of its segment k is the number wanted.
	leaf [MaxSegments]uint32
	all  uint32
	src  [MaxPaths]string
}

var (
	errNoPaths    = errors.New("usage: no paths")
	errTooMany    = errors.New("usage: more than 32 paths")
	errEmptySeg   = errors.New("usage: empty key in path")
	errLongSeg    = errors.New("usage: key longer than 64 bytes in path")
	errDeepPath   = errors.New("usage: more than 8 keys in path")
	errPathByte   = errors.New("usage: path keys are printable ASCII without '.', '[' or ']'")
	errDuplicated = errors.New("usage: path given twice")
)

// Compile checks and compiles dotted paths such as "usage.total_tokens". Each
// dot-separated segment names an object key, compared byte for byte (case
// sensitive) with the key as decoded from JSON, escapes included: "\u0075sage"
// matches "usage". Array indices are not supported: a path never descends
// into an array, and '[' and ']' are refused so that "choices[0]" cannot be
// mistaken for one. Keys are printable ASCII (0x20-0x7E) other than '.', at
// most MaxSegmentLen bytes; a path has at most MaxSegments keys; a set has at
// most MaxPaths paths. Compile allocates; nothing after it does.
func Compile(paths ...string) (*Paths, error) {
	if len(paths) == 0 {
		return nil, errNoPaths
	}
	if len(paths) > MaxPaths {
		return nil, errTooMany
	}
	p := &Paths{n: len(paths)}
	for i, s := range paths {
		for j := 0; j < i; j++ {
			if paths[j] == s {
				return nil, errDuplicated
			}
		}
		p.src[i] = s
		k, start := 0, 0
		for j := 0; j <= len(s); j++ {
			if j < len(s) {
				c := s[j]
				if c < 0x20 || c > 0x7e || c == '[' || c == ']' {
					return nil, errPathByte
				}
				if c != '.' {
					continue
				}
			}
			seg := s[start:j]
			switch {
			case seg == "":
				return nil, errEmptySeg
			case len(seg) > MaxSegmentLen:
				return nil, errLongSeg
			case k == MaxSegments:
				return nil, errDeepPath
			}
			p.segs[i][k] = seg
			k++
			start = j + 1
		}
		p.nseg[i] = uint8(k)
		p.leaf[k-1] |= 1 << i
		p.all |= 1 << i
	}
	return p, nil
}

// MustCompile is Compile for paths known to be valid; it panics otherwise.
func MustCompile(paths ...string) *Paths {
	p, err := Compile(paths...)
	if err != nil {
		panic(err)
	}
	return p
}

// Len is the number of paths.
func (p *Paths) Len() int { return p.n }

// Path is the i-th path as given to Compile.
func (p *Paths) Path(i int) string { return p.src[i] }
