package dashboard

// Ring keeps the last Cap values pushed, oldest first. The zero value is unusable; make one
// with NewRing. A Ring is not safe for concurrent use.
type Ring[T any] struct {
	buf   []T
	start int // index of the oldest value
	n     int
}

// NewRing returns an empty ring holding at most capacity values (at least 1).
func NewRing[T any](capacity int) *Ring[T] {
	if capacity < 1 {
		capacity = 1
	}
	return &Ring[T]{buf: make([]T, capacity)}
}

// Cap returns the capacity.
func (r *Ring[T]) Cap() int { return len(r.buf) }

// Len returns how many values the ring holds.
func (r *Ring[T]) Len() int { return r.n }

// Push appends v, dropping the oldest value when the ring is full.
func (r *Ring[T]) Push(v T) {
	if r.n < len(r.buf) {
		r.buf[(r.start+r.n)%len(r.buf)] = v
		r.n++
		return
	}
	r.buf[r.start] = v
	r.start = (r.start + 1) % len(r.buf)
}

// At returns the i-th value, 0 being the oldest. It panics if i is out of [0, Len()),
// like a slice index.
func (r *Ring[T]) At(i int) T {
	if i < 0 || i >= r.n {
		panic("dashboard: Ring index out of range")
	}
	return r.buf[(r.start+i)%len(r.buf)]
}

// Last returns the newest value and whether there is one.
func (r *Ring[T]) Last() (T, bool) {
	if r.n == 0 {
		var zero T
		return zero, false
	}
	return r.At(r.n - 1), true
}
