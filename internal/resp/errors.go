package resp

import "bytes"

// ErrorCode classifies an error reply by its first word, the part of a Redis
// error meant for programs ("NOSCRIPT No matching script...").
type ErrorCode uint8

// Error codes the Redis backend reacts to. CodeOther covers every other error.
const (
	CodeOther       ErrorCode = iota
	CodeErr                   // ERR: generic command error
	CodeNoScript              // NOSCRIPT: EVALSHA of a script the node does not have
	CodeMoved                 // MOVED: the slot lives on another node
	CodeAsk                   // ASK: the slot is being migrated
	CodeClusterDown           // CLUSTERDOWN: the cluster cannot serve the slot
	CodeTryAgain              // TRYAGAIN: multi-key command during resharding
	CodeLoading               // LOADING: the node is loading its dataset
	CodeBusy                  // BUSY: a script is running too long
	CodeWrongType             // WRONGTYPE: the key holds another type
	CodeNoAuth                // NOAUTH: authentication required
	CodeWrongPass             // WRONGPASS: bad credentials
	CodeNoPerm                // NOPERM: ACL forbids the command or key
	CodeReadOnly              // READONLY: write sent to a replica
	CodeCrossSlot             // CROSSSLOT: keys of one command in several slots
	CodeOOM                   // OOM: maxmemory reached
)

var codeNames = [...]string{
	CodeOther:       "",
	CodeErr:         "ERR",
	CodeNoScript:    "NOSCRIPT",
	CodeMoved:       "MOVED",
	CodeAsk:         "ASK",
	CodeClusterDown: "CLUSTERDOWN",
	CodeTryAgain:    "TRYAGAIN",
	CodeLoading:     "LOADING",
	CodeBusy:        "BUSY",
	CodeWrongType:   "WRONGTYPE",
	CodeNoAuth:      "NOAUTH",
	CodeWrongPass:   "WRONGPASS",
	CodeNoPerm:      "NOPERM",
	CodeReadOnly:    "READONLY",
	CodeCrossSlot:   "CROSSSLOT",
	CodeOOM:         "OOM",
}

// String returns the error prefix of c ("NOSCRIPT"), or "OTHER".
func (c ErrorCode) String() string {
	if int(c) < len(codeNames) && c != CodeOther {
		return codeNames[c]
	}
	return "OTHER"
}

// Classify returns the code of an error message (the Str of an Error value).
func Classify(msg []byte) ErrorCode {
	word := msg
	if i := bytes.IndexByte(msg, ' '); i >= 0 {
		word = msg[:i]
	}
	for c := CodeErr; int(c) < len(codeNames); c++ {
		if string(word) == codeNames[c] {
			return c
		}
	}
	return CodeOther
}

// ReplyError is an error reply from Redis as a Go error.
type ReplyError struct {
	Code ErrorCode
	Msg  string // the whole message, e.g. "MOVED 3999 127.0.0.1:6381"
}

func (e *ReplyError) Error() string { return "redis: " + e.Msg }

// Redirect parses a MOVED or ASK error message ("MOVED 3999 127.0.0.1:6381")
// into its slot and address. ok is false for any other message.
func Redirect(msg []byte) (code ErrorCode, slot int, addr []byte, ok bool) {
	code = Classify(msg)
	if code != CodeMoved && code != CodeAsk {
		return code, 0, nil, false
	}
	rest := msg[len(codeNames[code]):]
	if len(rest) == 0 || rest[0] != ' ' {
		return code, 0, nil, false
	}
	rest = rest[1:]
	sp := bytes.IndexByte(rest, ' ')
	if sp <= 0 || sp == len(rest)-1 {
		return code, 0, nil, false
	}
	n, good := parseInt(rest[:sp])
	if !good || n < 0 || n > 16383 {
		return code, 0, nil, false
	}
	return code, int(n), rest[sp+1:], true
}
