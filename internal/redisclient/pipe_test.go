package redisclient

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

// waitScriptPath polls until the binding's slot table has arrived.
func waitScriptPath(t *testing.T, c *Clusters) *router {
	t.Helper()
	b, err := c.binding("rc")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.router.addrOf(0) == "" {
		if time.Now().After(deadline) {
			t.Fatal("no slot table")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return b.router
}

const echoScript = "return {KEYS[1], tonumber(ARGV[1]), {redis.status_reply('OK')}, false}"

func evalEcho(t *testing.T, c *Clusters, key string, n int) (Status, string) {
	t.Helper()
	return do(t, c, "EVAL", echoScript, "1", key, strconv.Itoa(n))
}

func TestScriptCommand(t *testing.T) {
	for _, tc := range []struct {
		cmd  []byte
		slot int
		ok   bool
	}{
		{cmd("EVALSHA", "abc", "1", "foo", "x"), 12182, true},
		{cmd("evalsha", "abc", "2", "{user1000}.following", "bar"), keySlot([]byte("user1000")), true},
		{cmd("EVAL", "return 1", "1", "bar"), 5061, true},
		{cmd("FCALL_RO", "f", "1", "{}x"), keySlot([]byte("{}x")), true},
		{cmd("EVAL", "return 1", "0"), 0, false},
		{cmd("EVAL", "return 1", "2", "k"), 0, false},
		{cmd("EVAL", "return 1", "x", "k"), 0, false},
		{cmd("GET", "foo", "a", "b"), 0, false},
		{cmd("GET", "foo"), 12182, true},
		{cmd("incrby", "{user1000}.x", "5"), keySlot([]byte("user1000")), true},
		{cmd("INCRBY", "foo"), 0, false},
		{cmd("DECRBY", "bar", "1"), 5061, true},
		{cmd("PEXPIREAT", "foo", "1", "NX"), 12182, true},
		{cmd("PEXPIREAT", "foo", "1", "NX", "x"), 0, false},
		{cmd("PEXPIRE", "foo", "1"), 12182, true},
		{cmd("SET", "foo", "1"), 0, false},
		{cmd("DEL", "foo"), 0, false},
		{[]byte("*4\r\n$4\r\nEVAL\r\n$1\r\nx\r\n$1\r\n1\r\n$1\r\nk\r\nextra"), 0, false},
		{[]byte("*4\r\n$4\r\nEVAL\r\n$1\r\nx\r\n$1\r\n1\r\n$2\r\nk\r\n"), 0, false},
		{[]byte("*4\r\n$4\r\nEVAL\r\n$1\r\nx\r\n$1\r\n1\r\n:1\r\n"), 0, false},
		{[]byte("*-1\r\n"), 0, false},
		{nil, 0, false},
	} {
		slot, ok := pipeSlot(tc.cmd)
		if ok != tc.ok || (ok && slot != tc.slot) {
			t.Errorf("%q: slot %d %v, want %d %v", tc.cmd, slot, ok, tc.slot, tc.ok)
		}
	}
	if got := keySlot([]byte("123456789")); got != 0x31C3%numSlots {
		t.Errorf("keySlot(123456789) = %d", got)
	}
}

// keySlot (a table a byte at a time) agrees with the bit-by-bit CRC16 of
// redistest.Slot on keys of every length and byte value.
func TestKeySlotTable(t *testing.T) {
	key := make([]byte, 0, 300)
	for i := 0; i < 300; i++ {
		key = append(key, byte(i*131+7))
		if got, want := keySlot(key), redistest.Slot(string(key)); got != want {
			t.Fatalf("keySlot(%q) = %d, want %d", key, got, want)
		}
	}
	for _, k := range []string{"user1000", "{user1000}.following", "sluice:{r1|#abc}:x", "{}x", "a{b}c{d}"} {
		if got, want := keySlot([]byte(k)), redistest.Slot(k); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", k, got, want)
		}
	}
}

// Script calls go over the pipelined connections and come back as Redis's
// own bytes, on every node.
func TestScriptPathReplies(t *testing.T) {
	redistest.SkipShort(t)
	c := newClusters(t, 5*time.Second)
	r := waitScriptPath(t, c)
	before := r.sent.Load()
	nodes := map[int]bool{}
	for i := 0; i < 30; i++ {
		key := "script-path-" + strconv.Itoa(i)
		st, reply := evalEcho(t, c, key, i)
		want := "*4\r\n$" + strconv.Itoa(len(key)) + "\r\n" + key + "\r\n:" + strconv.Itoa(i) + "\r\n*1\r\n+OK\r\n$-1\r\n"
		if st != StatusOK || reply != want {
			t.Fatalf("%v %q, want %q", st, reply, want)
		}
		n, err := cluster.NodeOf(key)
		if err != nil {
			t.Fatal(err)
		}
		nodes[n] = true
	}
	if len(nodes) != len(cluster.Addrs) {
		t.Fatalf("keys reached %d nodes", len(nodes))
	}
	if st, reply := do(t, c, "EVALSHA", strings.Repeat("0", 40), "1", "k"); st != StatusOK || !strings.HasPrefix(reply, "-NOSCRIPT") {
		t.Fatalf("unknown script: %v %q", st, reply)
	}
	if got := r.sent.Load() - before; got != 31 {
		t.Fatalf("%d calls took the script path, want 31", got)
	}
	// Concurrent calls share the connections and each gets its own reply.
	var wg sync.WaitGroup
	errs := make(chan string, 400)
	for i := 0; i < 400; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "conc-" + strconv.Itoa(i%7)
			st, reply, err := c.Do(context.Background(), "rc", cmd("EVAL", echoScript, "1", key, strconv.Itoa(i)))
			if err != nil || st != StatusOK || !strings.Contains(reply2s(reply), ":"+strconv.Itoa(i)+"\r\n") {
				errs <- strconv.Itoa(i) + ": " + st.String() + " " + reply2s(reply)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func reply2s(b []byte) string { return string(b) }

// The single-key commands of keyedCmds take the script path too, on every
// node, and calls made back to back are answered in order: INCRBY then
// PEXPIREAT leaves a counted key with its expiry, as the peer's pipeline.
func TestScriptPathPlainCommands(t *testing.T) {
	redistest.SkipShort(t)
	c := newClusters(t, 5*time.Second)
	r := waitScriptPath(t, c)
	before := r.sent.Load()
	at := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	for i := 0; i < 20; i++ {
		key := "plain-path-" + strconv.Itoa(i)
		type res struct {
			i     int
			st    Status
			reply string
		}
		got := make(chan res, 3)
		for j, args := range [][]string{{"INCRBY", key, "3"}, {"PEXPIREAT", key, at}, {"DECRBY", key, "1"}} {
			if err := c.Call(context.Background(), "rc", cmd(args...), func(st Status, b []byte) { got <- res{j, st, string(b)} }); err != nil {
				t.Fatal(err)
			}
		}
		want := []string{":3\r\n", ":1\r\n", ":2\r\n"}
		for range 3 {
			g := <-got
			if g.st != StatusOK || g.reply != want[g.i] {
				t.Fatalf("%s reply %d: %v %q, want %q", key, g.i, g.st, g.reply, want[g.i])
			}
		}
		if st, reply := do(t, c, "GET", key); st != StatusOK || reply != "$1\r\n2\r\n" {
			t.Fatalf("GET %s: %v %q", key, st, reply)
		}
		if st, reply := do(t, c, "PEXPIRETIME", key); st != StatusOK || reply != ":"+at+"\r\n" {
			t.Fatalf("PEXPIRETIME %s: %v %q, want %s", key, st, reply, at)
		}
	}
	// 20 × (INCRBY, PEXPIREAT, DECRBY, GET); PEXPIRETIME took go-redis's path.
	if got := r.sent.Load() - before; got != 80 {
		t.Fatalf("%d calls took the script path, want 80", got)
	}
}

// A wrong slot table is corrected by MOVED, which is followed.
func TestScriptPathFollowsMoved(t *testing.T) {
	redistest.SkipShort(t)
	c := newClusters(t, 5*time.Second)
	r := waitScriptPath(t, c)
	key := "moved-key"
	slot := keySlot([]byte(key))
	owner := r.addrOf(slot)
	wrong := ""
	for _, a := range cluster.Addrs {
		if a != owner {
			wrong = a
			break
		}
	}
	if owner == "" || wrong == "" {
		t.Fatalf("owner %q wrong %q", owner, wrong)
	}
	r.slotsMu.Lock()
	r.slots[slot] = wrong
	r.slotsMu.Unlock()
	if st, reply := evalEcho(t, c, key, 7); st != StatusOK || !strings.Contains(reply, ":7\r\n") {
		t.Fatalf("after MOVED: %v %q", st, reply)
	}
	if got := r.addrOf(slot); got != owner {
		t.Fatalf("slot table not corrected: %q, want %q", got, owner)
	}
	// With no redirects allowed (MaxRedirects -1), the MOVED error itself
	// is the reply.
	c = New(map[string][]string{"rc": cluster.Addrs}, Options{MaxRedirects: -1})
	defer c.Close()
	if err := c.Init("rc", "", "", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	r = waitScriptPath(t, c)
	r.slotsMu.Lock()
	r.slots[slot] = wrong
	r.slotsMu.Unlock()
	if st, reply := evalEcho(t, c, key, 7); st != StatusOK || !strings.HasPrefix(reply, "-MOVED "+strconv.Itoa(slot)+" ") {
		t.Fatalf("MOVED without redirects: %v %q", st, reply)
	}
}

// A paused node: StatusTimeout within the timeout (plus the janitor's tick);
// a killed node: a failure at once; both recover.
func TestScriptPathTimeoutAndNodeFailure(t *testing.T) {
	redistest.SkipShort(t)
	const timeout = 150 * time.Millisecond
	c := newClusters(t, timeout)
	waitScriptPath(t, c)
	const key = "script-failing-node"
	if st, _ := evalEcho(t, c, key, 1); st != StatusOK {
		t.Fatal(st)
	}
	n, err := cluster.NodeOf(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.Pause(n); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		start := time.Now()
		st, reply := evalEcho(t, c, key, 1)
		el := time.Since(start)
		if st != StatusTimeout || reply != "" || el < timeout {
			t.Fatalf("paused node: %v %q after %v", st, reply, el)
		}
	}
	if err := cluster.Resume(n); err != nil {
		t.Fatal(err)
	}
	waitScriptOK(t, c, key)
	if err := cluster.Kill(n); err != nil {
		t.Fatal(err)
	}
	if st, reply := evalEcho(t, c, key, 1); st == StatusOK || reply != "" {
		t.Fatalf("dead node: %v %q", st, reply)
	}
	if err := cluster.Restart(n); err != nil {
		t.Fatal(err)
	}
	waitScriptOK(t, c, key)
}

func waitScriptOK(t *testing.T, c *Clusters, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, reply := evalEcho(t, c, key, 1)
		if st == StatusOK && strings.Contains(reply, ":1\r\n") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery: %v %q", st, reply)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The script path's connections authenticate with Init's credentials; a
// refused AUTH fails the call.
func TestScriptPathAuth(t *testing.T) {
	redistest.SkipShort(t)
	aclUser(t, "sluice-s", "~sluice-s*")
	for _, tc := range []struct {
		pass, key string
		ok        bool
		prefix    string
	}{
		{"s3cret", "sluice-s-k", true, "*4\r\n"},
		{"s3cret", "other-k", true, "-NOPERM"},
		{"wrong", "sluice-s-k", false, ""},
	} {
		c := New(map[string][]string{"rc": cluster.Addrs}, Options{})
		if err := c.Init("rc", "sluice-s", tc.pass, time.Second); err != nil {
			t.Fatal(err)
		}
		var sent func() int64
		if tc.ok {
			r := waitScriptPath(t, c)
			sent = r.sent.Load
		} else {
			// No slot table can be read (CLUSTER SLOTS is refused too):
			// force one, so that the call does take the script path.
			b, _ := c.binding("rc")
			t0 := make([]string, numSlots)
			for i := range t0 {
				t0[i] = cluster.Addrs[0]
			}
			b.router.slotsMu.Lock()
			b.router.slots = t0
			b.router.slotsMu.Unlock()
			sent = b.router.sent.Load
		}
		st, reply := evalEcho(t, c, tc.key, 3)
		c.Close()
		if (st == StatusOK) != tc.ok || !strings.HasPrefix(reply, tc.prefix) || sent() != 1 {
			t.Errorf("%+v: %v %q (%d on the script path)", tc, st, reply, sent())
		}
	}
}

// Script calls made at once after Init wait for the first slot table and
// then take the script path.
func TestScriptPathBeforeTheSlotTable(t *testing.T) {
	redistest.SkipShort(t)
	c := New(map[string][]string{"rc": cluster.Addrs}, Options{})
	defer c.Close()
	if err := c.Init("rc", "", "", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	b, _ := c.binding("rc")
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, reply, err := c.Do(context.Background(), "rc", cmd("EVAL", echoScript, "1", "early-"+strconv.Itoa(i), strconv.Itoa(i)))
			if err != nil || st != StatusOK || !strings.Contains(string(reply), ":"+strconv.Itoa(i)+"\r\n") {
				t.Errorf("%d: %v %v %q", i, err, st, reply)
			}
		}()
	}
	wg.Wait()
	if got := b.router.sent.Load(); got != 20 {
		t.Fatalf("%d calls on the script path, want 20", got)
	}
}

// nodeCmd runs a command on node i directly.
func nodeCmd(t *testing.T, i int, args ...any) any {
	t.Helper()
	cl := cluster.Client(i)
	defer cl.Close()
	v, err := cl.Do(context.Background(), args...).Result()
	if err != nil {
		t.Fatalf("node %d %v: %v", i, args, err)
	}
	return v
}

func askingCalls(t *testing.T, i int) int {
	info := nodeCmd(t, i, "INFO", "commandstats").(string)
	for _, l := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(l, "cmdstat_asking:calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

// A slot being migrated: the owner answers ASK for a key it no longer has,
// the call goes to the importing node after ASKING, and the slot table is
// left as it was (ASK is one call's redirect, not a new owner).
func TestScriptPathFollowsAsk(t *testing.T) {
	redistest.SkipShort(t)
	c := newClusters(t, 5*time.Second)
	r := waitScriptPath(t, c)
	key := "ask-key"
	slot := keySlot([]byte(key))
	owner, err := cluster.NodeOf(key)
	if err != nil {
		t.Fatal(err)
	}
	dest := (owner + 1) % len(cluster.Addrs)
	ownerID, destID := nodeCmd(t, owner, "CLUSTER", "MYID"), nodeCmd(t, dest, "CLUSTER", "MYID")
	nodeCmd(t, dest, "CLUSTER", "SETSLOT", slot, "IMPORTING", ownerID)
	nodeCmd(t, owner, "CLUSTER", "SETSLOT", slot, "MIGRATING", destID)
	t.Cleanup(func() {
		nodeCmd(t, owner, "CLUSTER", "SETSLOT", slot, "STABLE")
		nodeCmd(t, dest, "CLUSTER", "SETSLOT", slot, "STABLE")
	})
	before := askingCalls(t, dest)
	if st, reply := evalEcho(t, c, key, 7); st != StatusOK || !strings.Contains(reply, ":7\r\n") {
		t.Fatalf("through ASK: %v %q", st, reply)
	}
	if n := askingCalls(t, dest) - before; n != 1 {
		t.Fatalf("%d ASKING on the importing node, want 1", n)
	}
	if got := r.addrOf(slot); got != cluster.Addrs[owner] {
		t.Fatalf("slot table changed to %q by ASK", got)
	}
}

// CLUSTERDOWN comes before the command runs: the call is sent again (after
// 10 ms, 20 ms, …) while its deadline allows, and succeeds once the slot is
// served again; with retries off (MaxRedirects < 0) the error is the reply.
func TestScriptPathRetriesClusterDown(t *testing.T) {
	redistest.SkipShort(t)
	c := newClusters(t, 2*time.Second)
	waitScriptPath(t, c)
	key := "down-key"
	slot := keySlot([]byte(key))
	owner, err := cluster.NodeOf(key)
	if err != nil {
		t.Fatal(err)
	}
	nodeCmd(t, owner, "CLUSTER", "DELSLOTS", slot)
	restored := false
	restore := func() {
		if !restored {
			restored = true
			nodeCmd(t, owner, "CLUSTER", "ADDSLOTS", slot)
		}
	}
	t.Cleanup(restore)
	done := make(chan struct{})
	var st Status
	var reply string
	go func() {
		defer close(done)
		st, reply = evalEcho(t, c, key, 7)
	}()
	select {
	case <-done:
		t.Fatalf("answered while the slot is not served: %v %q", st, reply)
	case <-time.After(100 * time.Millisecond):
	}
	restore()
	<-done
	if st != StatusOK || !strings.Contains(reply, ":7\r\n") {
		t.Fatalf("after the slot came back: %v %q", st, reply)
	}
	// With no retries allowed, the error itself is the reply.
	c = New(map[string][]string{"rc": cluster.Addrs}, Options{MaxRedirects: -1})
	defer c.Close()
	if err := c.Init("rc", "", "", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	waitScriptPath(t, c)
	nodeCmd(t, owner, "CLUSTER", "DELSLOTS", slot)
	restored = false
	if st, reply := evalEcho(t, c, key, 7); st != StatusOK || !strings.HasPrefix(reply, "-CLUSTERDOWN") {
		t.Fatalf("CLUSTERDOWN without retries: %v %q", st, reply)
	}
	restore()
	waitScriptOK(t, c, key)
}
