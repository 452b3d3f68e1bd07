// SPDX-License-Identifier: Apache-2.0

package httpserve

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// problemBaseURI and the kinds below are as idemsvc's problem table
// (internal/handlers) names and titles them; a test there checks that
// they agree.
const problemBaseURI = "https://idemsvc.dev/problems/"

// ConnectionProblem is the complete HTTP/1.1 answer, an RFC 9457 problem
// detail, to a request answered before any handler could see it: a
// malformed request or an unknown transfer coding (400 invalid-request;
// net/http's 501 for the latter becomes 400, as bad input gets a 4xx),
// headers over the limit (431 too-large), a connection over the cap (503
// store-unavailable, with Retry-After). detail is net/http's own fixed
// text, or the refusal's. The connection is closed after it.
func ConnectionProblem(status int, detail string) []byte {
	kind, title, retry := "invalid-request", "Invalid request", ""
	switch {
	case status == http.StatusRequestHeaderFieldsTooLarge:
		kind, title = "too-large", "Too large"
	case status == http.StatusServiceUnavailable:
		kind, title, retry = "store-unavailable", "Store unavailable", "Retry-After: 1\r\n"
	case status >= 500: // net/http's 501 for an unknown transfer coding
		status = http.StatusBadRequest
	}
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Code   string `json:"code"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{problemBaseURI + kind, kind, title, status, detail})
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nCache-Control: no-store\r\nConnection: close\r\n"+
		"Content-Length: %d\r\nContent-Type: application/problem+json\r\n%s\r\n%s", status, http.StatusText(status), len(body), retry, body)
}
