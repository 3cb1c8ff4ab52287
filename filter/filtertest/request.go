package filtertest

// NewRequest is a request from src (the source address, "ip:port") with the headers given
// as name, value pairs.
func NewRequest(src string, hdrs ...string) Request {
	r := Request{Source: src}
	for i := 0; i+1 < len(hdrs); i += 2 {
		r.Headers = append(r.Headers, [2]string{hdrs[i], hdrs[i+1]})
	}
	return r
}
