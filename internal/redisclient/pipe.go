package redisclient

// The script path: EVAL, EVALSHA, FCALL (and their _RO forms) with at least
// one key — every command the sluice guest sends — and a few single-key
// commands (keyedCmds) bypass go-redis. They go,
// as the guest's own RESP bytes, over one pipelined connection per cluster
// node, and the reply is handed to the callback as Redis's own RESP bytes:
// no goroutine, timer, string conversion or re-encoding per call. The slot
// of the first key picks the node from a slot table read with CLUSTER SLOTS
// (at Init, and again after every MOVED); MOVED and ASK replies are followed
// (ASK with ASKING pipelined before the command) up to MaxRedirects times.
// Concurrent calls from every VM share the node's connection, so Redis reads
// and answers them in batches (fewer system calls on its side per decision).
//
// Timeouts: one janitor goroutine per binding looks at the calls of each
// connection every timeout/8 (between 1 and 25 ms) and answers those past
// their deadline with StatusTimeout (a late reply is then dropped); a
// connection whose oldest call is still unanswered max(4 × timeout, 1 s)
// after its deadline is closed. A dial, AUTH or read failure
// fails the calls on that connection with StatusNetworkError; the next call
// dials again. Nothing is retried but redirects and the two refusals that
// come before the command runs, TRYAGAIN and CLUSTERDOWN (resent after
// 10 ms, 20 ms, … 50 ms from a fresh slot table while the call's deadline
// allows; not when MaxRedirects is negative): a script retried after
// anything else could charge twice.
//
// Script calls made before the first slot table wait for it (up to their
// deadline); once it arrives, a connection to every master is opened at
// once. Other commands take the general path through go-redis.

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/internal/resp"
)

const numSlots = 16384

// pcall is one call on the script path.
type pcall struct {
	cmd       []byte // the guest's command (a copy)
	slot      int
	cb        func(Status, []byte)
	deadline  time.Time
	redirects int
	retries   int  // after TRYAGAIN or CLUSTERDOWN
	discard   bool // the reply of an ASKING sent before an ASK redirect
	expired   bool // answered StatusTimeout; its reply is dropped (pconn.mu)
}

// router is the script path of one binding (one client key).
type router struct {
	k            clientKey
	client       *goredis.ClusterClient // for CLUSTER SLOTS
	maxRedirects int
	tls          *tls.Config           // nil: cleartext
	lastErr      atomic.Pointer[error] // why the last connection failed (tls.go)

	slotsMu    sync.RWMutex
	slots      []string // node address by slot; nil until the first CLUSTER SLOTS
	waiting    []*pcall // calls made before the first slot table
	refreshing atomic.Bool
	lostAt     atomic.Int64 // Unix ns of the last refresh a lost connection asked for

	sent atomic.Int64 // calls that took the script path (tests)

	mu     sync.Mutex
	conns  map[string]*pconn
	closed bool
	stop   chan struct{}
}

func newRouter(k clientKey, client *goredis.ClusterClient, maxRedirects int, tlsConfig *tls.Config) *router {
	r := &router{k: k, client: client, maxRedirects: maxRedirects, tls: tlsConfig, conns: map[string]*pconn{}, stop: make(chan struct{})}
	r.refresh()
	go r.janitor()
	return r
}

// refresh reads the slot table in the background (at most one at a time).
func (r *router) refresh() {
	if !r.refreshing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer r.refreshing.Store(false)
		ctx, cancel := contextWithTimeout(r.k.timeout)
		defer cancel()
		ranges, err := r.readSlots(ctx)
		if err != nil {
			r.slotsFailed(err)
		}
		if err != nil || len(ranges) == 0 {
			// Calls waiting for a first table fail; the next call asks again.
			r.failWaiting()
			return
		}
		t := make([]string, numSlots)
		for _, s := range ranges {
			if len(s.Nodes) == 0 || s.Start < 0 || s.End >= numSlots || s.Start > s.End {
				continue
			}
			for i := s.Start; i <= s.End; i++ {
				t[i] = s.Nodes[0].Addr
			}
		}
		var masters []string
		for _, s := range ranges {
			if len(s.Nodes) > 0 {
				masters = append(masters, s.Nodes[0].Addr)
			}
		}
		r.slotsMu.Lock()
		first := r.slots == nil
		r.slots = t
		w := r.waiting
		r.waiting = nil
		r.slotsMu.Unlock()
		if first {
			// Connect to every master now, not in the first burst.
			for _, a := range masters {
				r.conn(a)
			}
		}
		for _, c := range w {
			if addr := r.addrOf(c.slot); addr != "" {
				r.send(addr, c, false)
			} else {
				c.cb(StatusNetworkError, nil)
			}
		}
	}()
}

func (r *router) addrOf(slot int) string {
	r.slotsMu.RLock()
	defer r.slotsMu.RUnlock()
	if r.slots == nil {
		return ""
	}
	return r.slots[slot]
}

// moved records a MOVED answer at once (the full table is read again too).
func (r *router) moved(slot int, addr string) {
	r.slotsMu.Lock()
	if r.slots != nil {
		r.slots[slot] = addr
	}
	r.slotsMu.Unlock()
	r.refresh()
}

// call sends c to the node owning its slot; false if the table has no node
// for it. Before the first table, c waits for it (or its deadline).
func (r *router) call(c *pcall) bool {
	r.slotsMu.Lock()
	if r.slots == nil {
		r.waiting = append(r.waiting, c)
		r.slotsMu.Unlock()
		r.sent.Add(1)
		r.refresh()
		return true
	}
	addr := r.slots[c.slot]
	r.slotsMu.Unlock()
	if addr == "" {
		return false
	}
	r.sent.Add(1)
	r.send(addr, c, false)
	return true
}

func (r *router) send(addr string, c *pcall, asking bool) {
	for {
		pc := r.conn(addr)
		if pc == nil {
			c.cb(StatusNetworkError, nil)
			return
		}
		if pc.send(c, asking) {
			return
		}
		// The connection died between lookup and send: take a new one.
	}
}

func (r *router) conn(addr string) *pconn {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	pc := r.conns[addr]
	if pc == nil {
		pc = &pconn{r: r, addr: addr, kick: make(chan struct{}, 1), done: make(chan struct{})}
		r.conns[addr] = pc
		go pc.run()
	}
	return pc
}

func (r *router) drop(pc *pconn) {
	r.mu.Lock()
	if r.conns[pc.addr] == pc {
		delete(r.conns, pc.addr)
	}
	r.mu.Unlock()
}

// expireWaiting fails the calls that waited for a first slot table past
// their deadline.
func (r *router) expireWaiting(now time.Time) {
	r.slotsMu.Lock()
	var late []*pcall
	kept := r.waiting[:0]
	for _, c := range r.waiting {
		if now.After(c.deadline) {
			late = append(late, c)
		} else {
			kept = append(kept, c)
		}
	}
	r.waiting = kept
	r.slotsMu.Unlock()
	for _, c := range late {
		c.cb(StatusTimeout, nil)
	}
}

func (r *router) close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	close(r.stop)
	conns := make([]*pconn, 0, len(r.conns))
	for _, pc := range r.conns {
		conns = append(conns, pc)
	}
	clear(r.conns)
	r.mu.Unlock()
	for _, pc := range conns {
		pc.fail(StatusNetworkError)
	}
	r.failWaiting()
}

// failWaiting fails the calls waiting for a slot table.
func (r *router) failWaiting() {
	r.slotsMu.Lock()
	w := r.waiting
	r.waiting = nil
	r.slotsMu.Unlock()
	for _, c := range w {
		c.cb(StatusNetworkError, nil)
	}
}

func (r *router) janitor() {
	tick := r.k.timeout / 8
	tick = max(min(tick, 25*time.Millisecond), time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case now := <-t.C:
			r.mu.Lock()
			var stuck []*pconn
			var late []*pcall
			for _, pc := range r.conns {
				var dead bool
				late, dead = pc.expire(now, late)
				if dead {
					stuck = append(stuck, pc)
				}
			}
			r.mu.Unlock()
			for _, c := range late {
				c.cb(StatusTimeout, nil)
			}
			for _, pc := range stuck {
				pc.fail(StatusTimeout)
			}
			r.expireWaiting(now)
		}
	}
}

// pconn is one pipelined connection to a node. Calls are answered in the
// order they were written; queue holds them in that order.
//
// send only appends a call's bytes to out and, when out was empty, wakes
// the connection's writer goroutine, which yields once (runtime.Gosched)
// and then writes everything appended since its last write in one system
// call. The worker that made the call never waits for the socket, and under
// load one write carries the calls that every VM made meanwhile: Redis then
// reads them in one read and answers them in one write (measured: about
// 2.7 calls per write over 1,000 keys, Redis CPU per decision down a third).
type pconn struct {
	r    *router
	addr string
	kick chan struct{} // capacity 1: out has bytes for the writer
	done chan struct{} // closed when the connection dies

	mu     sync.Mutex
	nc     net.Conn // nil while dialing
	out    []byte   // queued bytes not yet taken by the writer
	queue  []*pcall
	dead   bool
	status Status // why it died
}

var asking = []byte("*1\r\n$6\r\nASKING\r\n")

// send queues c (after an ASKING when asking) and writes it; false if the
// connection is dead.
func (pc *pconn) send(c *pcall, ask bool) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.dead {
		return false
	}
	if ask {
		pc.queue = append(pc.queue, &pcall{discard: true, deadline: c.deadline})
	}
	pc.queue = append(pc.queue, c)
	wake := len(pc.out) == 0 && pc.nc != nil // while dialing, run wakes the writer
	if ask {
		pc.out = append(pc.out, asking...)
	}
	pc.out = append(pc.out, c.cmd...)
	if wake {
		select {
		case pc.kick <- struct{}{}:
		default: // already woken
		}
	}
	return true
}

// maxSpare bounds the write buffer the writer keeps for reuse.
const maxSpare = 64 << 10

// writer writes what send queued, all of it in one write each time it
// wakes, until the connection dies. A failed write closes the connection:
// the reader sees it and fails the queue.
func (pc *pconn) writer(nc net.Conn) {
	var spare []byte
	for {
		select {
		case <-pc.kick:
		case <-pc.done:
			return
		}
		// Let the goroutines already runnable (the workers, the
		// HTTP handlers) run first: under load they add their calls to
		// this write; on an idle machine this returns at once.
		runtime.Gosched()
		pc.mu.Lock()
		b := pc.out
		pc.out = spare[:0]
		dead := pc.dead
		pc.mu.Unlock()
		if dead {
			return
		}
		if len(b) == 0 {
			continue
		}
		if _, err := nc.Write(b); err != nil {
			nc.Close()
			return
		}
		if cap(b) <= maxSpare {
			spare = b
		} else {
			spare = nil
		}
	}
}

// expire marks the calls past their deadline as expired and appends them to
// late (their replies, if they come, are dropped); dead reports a
// connection whose oldest call has waited stuckAfter past its deadline.
func (pc *pconn) expire(now time.Time, late []*pcall) (_ []*pcall, dead bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.dead || len(pc.queue) == 0 {
		return late, false
	}
	for _, c := range pc.queue {
		if !now.After(c.deadline) {
			break // queued in order, with one timeout: the rest are later
		}
		if !c.expired {
			c.expired = true
			if !c.discard {
				late = append(late, c)
			}
		}
	}
	return late, now.Sub(pc.queue[0].deadline) > stuckAfter(pc.r.k.timeout)
}

// stuckAfter is how long past its deadline the oldest call of a connection
// may wait before the connection is given up (a node that stopped
// answering); until then only the calls past their deadline fail.
func stuckAfter(timeout time.Duration) time.Duration {
	return max(4*timeout, time.Second)
}

// fail kills the connection and fails every queued call with st.
func (pc *pconn) fail(st Status) {
	pc.mu.Lock()
	if pc.dead {
		pc.mu.Unlock()
		return
	}
	pc.dead, pc.status = true, st
	close(pc.done)
	q := pc.queue
	pc.queue, pc.out = nil, nil
	if pc.nc != nil {
		pc.nc.Close()
	}
	pc.mu.Unlock()
	pc.r.drop(pc)
	for _, c := range q {
		if !c.discard && !c.expired {
			c.cb(st, nil)
		}
	}
}

func (pc *pconn) run() {
	k := pc.r.k
	nc, err := dialNode(pc.addr, k.timeout, pc.r.tls)
	if err != nil {
		pc.r.connFailed(pc.addr, err)
		pc.r.connLost()
		pc.fail(dialStatus(err))
		return
	}
	br := bufio.NewReaderSize(nc, 16<<10)
	if k.pass != "" {
		var auth []byte
		if k.user != "" {
			auth = appendCmd(nil, "AUTH", k.user, k.pass)
		} else {
			auth = appendCmd(nil, "AUTH", k.pass)
		}
		nc.SetDeadline(time.Now().Add(k.timeout))
		var line string
		if _, err = nc.Write(auth); err == nil {
			line, err = br.ReadString('\n')
		}
		nc.SetDeadline(time.Time{})
		if err != nil || line != "+OK\r\n" {
			// A refused AUTH: every call fails, as on a connection
			// that could not be made.
			pc.r.connFailed(pc.addr, authError(err, line))
			nc.Close()
			pc.fail(StatusNetworkError)
			return
		}
	}
	pc.mu.Lock()
	if pc.dead {
		pc.mu.Unlock()
		nc.Close()
		return
	}
	pc.nc = nc
	if len(pc.out) > 0 {
		pc.kick <- struct{}{} // the calls made while dialing
	}
	pc.mu.Unlock()
	go pc.writer(nc)
	pc.read(br)
}

func dialStatus(err error) Status {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return StatusTimeout
	}
	return StatusNetworkError
}

// read delivers replies in order until the connection breaks.
func (pc *pconn) read(br *bufio.Reader) {
	var raw []byte
	answered := false
	for {
		var err error
		raw, err = readReply(br, raw[:0], 0)
		if err != nil {
			pc.mu.Lock()
			closed := pc.dead
			pc.mu.Unlock()
			if !answered && !closed {
				// Before any reply: the handshake's end (a server
				// refusing the client's certificate says so here).
				pc.r.connFailed(pc.addr, err)
			}
			if !closed {
				pc.r.connLost()
			}
			pc.fail(StatusNetworkError)
			return
		}
		if !answered {
			answered = true
			pc.r.lastErr.Store(nil)
		}
		pc.mu.Lock()
		if pc.dead || len(pc.queue) == 0 {
			// Dead: fail already answered the queue. A reply with
			// nothing queued breaks the protocol: give up on it.
			dead := pc.dead
			pc.mu.Unlock()
			if !dead {
				pc.fail(StatusNetworkError)
			}
			return
		}
		c := pc.queue[0]
		pc.queue[0] = nil
		pc.queue = pc.queue[1:]
		expired := c.expired
		pc.mu.Unlock()
		if c.discard || expired {
			continue
		}
		pc.reply(c, raw)
	}
}

func (pc *pconn) reply(c *pcall, raw []byte) {
	if raw[0] == '-' && c.redirects < pc.r.maxRedirects {
		msg := raw[1 : len(raw)-2]
		if code, slot, addr, ok := resp.Redirect(msg); ok {
			c.redirects++
			if code == resp.CodeMoved {
				pc.r.moved(slot, string(addr))
			}
			pc.r.send(string(addr), c, code == resp.CodeAsk)
			return
		}
	}
	if raw[0] == '-' && pc.r.maxRedirects >= 0 {
		switch resp.Classify(raw[1 : len(raw)-2]) {
		case resp.CodeTryAgain, resp.CodeClusterDown:
			// Refused before the command ran (the cluster cannot serve
			// the slot, or a multi-key command during resharding), so
			// sending it again cannot charge twice: again after a
			// pause, from a fresh slot table (the same node while it
			// names none), while the deadline allows.
			c.retries++
			wait := min(time.Duration(c.retries)*retryPause, 5*retryPause)
			if time.Now().Add(wait).Before(c.deadline) {
				pc.r.refresh()
				addr := pc.addr
				time.AfterFunc(wait, func() {
					if a := pc.r.addrOf(c.slot); a != "" {
						addr = a
					}
					pc.r.send(addr, c, false)
				})
				return
			}
		}
	}
	c.cb(StatusOK, append([]byte(nil), raw...))
}

// retryPause is the pause before the first resend after TRYAGAIN or
// CLUSTERDOWN; the n-th waits n times as long, at most 5 times.
const retryPause = 10 * time.Millisecond

// maxReplyDepth bounds the nesting of arrays in a reply.
const maxReplyDepth = 32

var errProtocol = errors.New("redisclient: malformed reply")

// readReply appends one complete RESP2 reply read from br to dst.
func readReply(br *bufio.Reader, dst []byte, depth int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return dst, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return dst, errProtocol
	}
	dst = append(dst, line...)
	switch line[0] {
	case '+', '-', ':':
		return dst, nil
	case '$':
		n, err := strconv.Atoi(string(line[1 : len(line)-2]))
		if err != nil || n < -1 {
			return dst, errProtocol
		}
		if n == -1 {
			return dst, nil
		}
		start := len(dst)
		dst = append(dst, make([]byte, n+2)...)
		if _, err := io.ReadFull(br, dst[start:]); err != nil {
			return dst, err
		}
		if dst[len(dst)-2] != '\r' || dst[len(dst)-1] != '\n' {
			return dst, errProtocol
		}
		return dst, nil
	case '*':
		n, err := strconv.Atoi(string(line[1 : len(line)-2]))
		if err != nil || n < -1 || depth >= maxReplyDepth {
			return dst, errProtocol
		}
		for i := 0; i < n; i++ {
			if dst, err = readReply(br, dst, depth+1); err != nil {
				return dst, err
			}
		}
		return dst, nil
	}
	return dst, errProtocol
}

func appendCmd(dst []byte, args ...string) []byte {
	dst = resp.AppendArrayHeader(dst, len(args))
	for _, a := range args {
		dst = resp.AppendBulkString(dst, a)
	}
	return dst
}

// pipeSlot reports whether cmd takes the pipe path, and the slot of its
// (first) key: a script call with at least one key, or one of keyedCmds
// with its one key at argument 1 and an argument count it allows.
func pipeSlot(cmd []byte) (int, bool) {
	var args [4][]byte
	n, ok := splitCommand(cmd, args[:])
	if !ok || n < 2 {
		return 0, false
	}
	switch {
	case eqFold(args[0], "EVALSHA"), eqFold(args[0], "EVAL"), eqFold(args[0], "FCALL"),
		eqFold(args[0], "EVALSHA_RO"), eqFold(args[0], "EVAL_RO"), eqFold(args[0], "FCALL_RO"):
		// The guest's calls: checked first.
		if n < 4 {
			return 0, false
		}
		nk, err := strconv.Atoi(string(args[2]))
		if err != nil || nk < 1 || nk > n-3 {
			return 0, false
		}
		return keySlot(args[3]), true
	}
	for _, k := range keyedCmds {
		if eqFold(args[0], k.name) {
			if n < k.min || n > k.max {
				return 0, false
			}
			return keySlot(args[1]), true
		}
	}
	return 0, false
}

// keyedCmds are the plain commands the pipe path takes: each has exactly
// one key, its first argument, for every argument count from min to max
// (the command's name counted). sluice serve --charge-denied sends INCRBY
// and PEXPIREAT back to back, as envoyproxy/ratelimit does; the same
// connection keeps them in order.
var keyedCmds = []struct {
	name     string
	min, max int
}{
	{"GET", 2, 2},
	{"INCRBY", 3, 3},
	{"DECRBY", 3, 3},
	{"PEXPIREAT", 3, 4},
	{"PEXPIRE", 3, 4},
}

// splitCommand validates cmd as one RESP array of bulk strings with nothing
// after it, puts its first len(args) elements in args and returns the count.
func splitCommand(b []byte, args [][]byte) (int, bool) {
	n, i, ok := header(b, 0, '*')
	if !ok || n < 1 {
		return 0, false
	}
	for k := 0; k < n; k++ {
		var l int
		l, i, ok = header(b, i, '$')
		if !ok || l < 0 || len(b)-i < l+2 || b[i+l] != '\r' || b[i+l+1] != '\n' {
			return 0, false
		}
		if k < len(args) {
			args[k] = b[i : i+l]
		}
		i += l + 2
	}
	return n, i == len(b)
}

// header parses "<t><decimal>\r\n" at b[i:].
func header(b []byte, i int, t byte) (n, next int, ok bool) {
	if i >= len(b) || b[i] != t {
		return 0, 0, false
	}
	i++
	neg := i < len(b) && b[i] == '-'
	if neg {
		i++
	}
	start := i
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if i-start >= 10 {
			return 0, 0, false
		}
		n = n*10 + int(b[i]-'0')
	}
	if i == start || len(b)-i < 2 || b[i] != '\r' || b[i+1] != '\n' {
		return 0, 0, false
	}
	if neg {
		n = -n
	}
	return n, i + 2, true
}

func eqFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c := b[i]
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// keySlot is Redis Cluster's slot of a key: CRC16 (XMODEM) of its hash tag
// (the bytes between the first '{' and the next '}', when not empty) or of
// the whole key, modulo 16384.
func keySlot(key []byte) int {
	for i, c := range key {
		if c == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						key = key[i+1 : j]
					}
					break
				}
			}
			break
		}
	}
	var crc uint16
	for _, c := range key {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^c]
	}
	return int(crc % numSlots)
}

// crcTable is CRC16-XMODEM (polynomial 0x1021) a byte at a time.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for k := 0; k < 8; k++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
