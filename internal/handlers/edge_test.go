package handlers_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/httpserve"
)

// The answers written before any handler runs (internal/httpserve) name
// their problem kinds as the table here does, with its statuses (431 for
// headers over the limit aside).
func TestConnectionProblemKindsAgree(t *testing.T) {
	types := handlers.ProblemTypes()
	for _, status := range []int{400, 431, 501, 503} {
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(httpserve.ConnectionProblem(status, "detail"))), nil)
		if err != nil {
			t.Fatal(err)
		}
		var p struct {
			Type   string
			Title  string
			Status int
		}
		if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
			t.Fatal(err)
		}
		// too-large is 413 but for headers, which net/http answers 431.
		if want, ok := types[p.Type]; !ok || (want != p.Status && status != 431) || p.Status != resp.StatusCode || p.Title == "" || !resp.Close {
			t.Errorf("%d: %d %+v; the table has %q as %d", status, resp.StatusCode, p, p.Type, want)
		}
		if status == 503 && resp.Header.Get("Retry-After") == "" {
			t.Errorf("503 without Retry-After")
		}
	}
}
