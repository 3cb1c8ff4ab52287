package envoyproc

import (
	"fmt"
	"regexp"
	"strconv"
)

var workerCxRE = regexp.MustCompile(`^listener\.(.+)\.worker_([0-9]+)\.downstream_cx_total$`)

// WorkerConnections returns, per worker thread (0 to --concurrency − 1), the connections
// that worker accepted on the listeners so far: Envoy's per-worker listener counters
// listener.<address>.worker_<N>.downstream_cx_total, summed over listeners (the admin
// listener has none). <address> is the listener's configured address (port 0 stays 0).
func (e *Envoy) WorkerConnections() (map[int]int64, error) {
	st, err := e.Stats(`worker_[0-9]+\.downstream_cx_total`)
	if err != nil {
		return nil, err
	}
	m := map[int]int64{}
	for name, v := range st {
		sm := workerCxRE.FindStringSubmatch(name)
		if sm == nil {
			continue
		}
		w, err := strconv.Atoi(sm[2])
		if err != nil {
			return nil, fmt.Errorf("stat %s: %v", name, err)
		}
		m[w] += v
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("no listener.*.worker_N.downstream_cx_total in /stats: %v", st)
	}
	return m, nil
}
