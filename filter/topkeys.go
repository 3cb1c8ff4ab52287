package filter

import (
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/internal/topk"
)

// Top keys ("top_keys"): per rule, a Space-Saving summary of the keys it denied and one of
// the keys that consumed it (weighted by cost), in each worker. Requests add to the
// worker's summaries (no allocation, fixed memory); once a second the root context's tick
// merges them into the rule's summary in shared data (compare-and-swap) and empties them,
// as does the first request a second after the last merge.
// The shared summary covers one period (top_keys.log_every, else TopKeysPeriod): the
// worker whose merge finds the period over starts the next one, keeps the finished one
// under the key's ":last" and, with log_every, logs its top log_top keys.

// TopKeysPeriod is the period of the shared summaries without top_keys.log_every.
const TopKeysPeriod = time.Minute

// topFlushMS is the period of the merges into shared data.
const topFlushMS = 1000

// TopKeysPrefix starts the shared-data key of every shared summary:
// TopKeysPrefix + PLUGIN + ":" + RULE + ":" + KIND (KIND "denied" or "consumed"), and the
// finished period's under the same key + ":last". The value is topk's encoding.
const TopKeysPrefix = topk.SharedPrefix

type topKeys struct {
	p      *Plugin
	cfg    *config.TopKeys
	period int64
	kinds  [2][]*topk.Summary // [denied, consumed] by rule index
	keys   [2][][]byte        // their shared-data keys
	shown  []byte
	enc    []byte
	merged *topk.Summary
	// nextFlush is when a request next merges the summaries (a host whose ticks stop
	// when nothing waits, as the dynamic module's, still merges them).
	nextFlush int64
}

var topKindNames = [2]string{"denied", "consumed"}

func newTopKeys(p *Plugin, cfg *config.TopKeys) *topKeys {
	t := &topKeys{p: p, cfg: cfg, period: int64(TopKeysPeriod), shown: make([]byte, 0, maxShownKey+8), merged: topk.New(cfg.Size)}
	if cfg.LogEvery > 0 {
		t.period = int64(cfg.LogEvery)
	}
	for k := range t.kinds {
		for _, rc := range p.cfg.Rules {
			t.kinds[k] = append(t.kinds[k], topk.New(cfg.Size))
			t.keys[k] = append(t.keys[k], []byte(TopKeysPrefix+p.name+":"+ruleID(p.scope, rc.Name)+":"+topKindNames[k]))
		}
	}
	return t
}

func (t *topKeys) add(s *topk.Summary, r *rule, w int64) {
	if w <= 0 {
		return
	}
	e, fresh := s.Add(hashKey(publicKeySeed, r.key), uint64(w))
	if fresh {
		t.shown = appendShownKey(t.shown[:0], r.key, t.cfg.Key)
		e.SetShown(t.shown)
	}
}

func (t *topKeys) denied(r *rule)   { t.add(t.kinds[0][r.cfg.Index], r, 1) }
func (t *topKeys) consumed(r *rule) { t.add(t.kinds[1][r.cfg.Index], r, r.units) }

// tick merges every summary with something in it into shared data.
func (t *topKeys) tick(now int64) {
	t.nextFlush = now + topFlushMS*1e6
	for k := range t.kinds {
		for i, s := range t.kinds[k] {
			if s.Total() > 0 {
				t.flush(s, t.keys[k][i], i, k, now)
			}
		}
	}
}

// flush merges s into the shared summary under key (compare-and-swap, a few tries; a
// summary that cannot be merged now stays for the next tick).
func (t *topKeys) flush(s *topk.Summary, key []byte, rule, kind int, now int64) {
	h := t.p.host
	for try := 0; try < 4; try++ {
		val, cas, st := h.GetSharedData(key)
		t.merged.Reset()
		since := now
		if st == abi.StatusOK && len(val) > 0 {
			var err error
			if since, err = t.merged.Merge(val); err != nil {
				t.merged.Reset()
				since = now
			}
		}
		rotate := now-since >= t.period
		if rotate {
			t.enc = s.Append(t.enc[:0], now)
		} else {
			t.enc = s.Append(t.enc[:0], since)
			t.merged.Merge(t.enc)
			t.enc = t.merged.Append(t.enc[:0], since)
		}
		switch h.SetSharedData(key, t.enc, cas) {
		case abi.StatusCASMismatch:
			continue
		case abi.StatusOK:
		default:
			return
		}
		s.Reset()
		if rotate {
			t.enc = t.merged.Append(t.enc[:0], since)
			h.SetSharedData(append(key[:len(key):len(key)], ":last"...), t.enc, 0)
			if t.cfg.LogEvery > 0 && t.merged.Total() > 0 {
				h.Log(abi.LogInfo, t.line(rule, kind, since, now))
			}
		}
		return
	}
}

// line is the log line of a finished period: the top log_top keys of the rule's kind with
// their counts, and the error bound of the period.
func (t *topKeys) line(rule, kind int, since, now int64) string {
	m := t.merged
	var b strings.Builder
	b.WriteString("sluice: top keys: rule ")
	b.WriteString(ruleID(t.p.scope, t.p.cfg.Rules[rule].Name))
	b.WriteString(" " + topKindNames[kind] + " over ")
	b.WriteString(time.Duration(now - since).Round(time.Second).String())
	b.WriteString(": total " + strconv.FormatUint(m.Total(), 10))
	b.WriteString(", error <= " + strconv.FormatUint(m.Total()/uint64(m.Cap()), 10) + ":")
	for _, e := range m.Top(t.cfg.LogTop) {
		b.WriteByte(' ')
		b.Write(e.Shown())
		b.WriteByte('=')
		b.WriteString(strconv.FormatUint(e.Count, 10))
	}
	return b.String()
}
