// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/testkit/testpki"
)

// exchange writes raw to a new connection to idemsvc and reads one answer,
// and whether the connection was closed after it.
func exchange(t *testing.T, dial func() (net.Conn, error), raw string) (*http.Response, []byte, bool) {
	t.Helper()
	conn, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read the answer to %.40q: %v", raw, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = br.ReadByte()
	// EOF, or a reset where the server closed with part of a request unread.
	var timeout net.Error
	return resp, body, err != nil && !(errors.As(err, &timeout) && timeout.Timeout())
}

// The errors net/http answers before any handler runs are problem details
// too, over HTTP and HTTPS; a request with both Content-Length and
// Transfer-Encoding is answered and its connection closed (RFC 9112).
func TestProtocolErrorsAreProblems(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "idemsvc test CA")
	certFile, keyFile := ca.Issue(t, "idemsvc").Write(t, dir, "idemsvc")
	plain := start(t, nil, nil)
	secure := start(t, nil, []string{"IDEMSVC_TLS_CERT_FILE=" + certFile, "IDEMSVC_TLS_KEY_FILE=" + keyFile})
	dialers := map[string]func() (net.Conn, error){
		"http": func() (net.Conn, error) { return net.Dial("tcp", strings.TrimPrefix(plain.url, "http://")) },
		"https": func() (net.Conn, error) {
			return tls.Dial("tcp", strings.TrimPrefix(secure.url, "https://"), &tls.Config{RootCAs: ca.Pool()})
		},
	}
	huge := "X-Filler: " + strings.Repeat("a", 80<<10) + "\r\n"
	for scheme, dial := range dialers {
		for _, tt := range []struct {
			name, raw string
			status    int
			kind      string
		}{
			{"malformed Host", "GET /healthz HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "invalid-request"},
			{"no Host", "GET /healthz HTTP/1.1\r\n\r\n", 400, "invalid-request"},
			{"headers over the limit", "GET /healthz HTTP/1.1\r\nHost: x\r\n" + huge + "\r\n", 431, "too-large"},
			{"unknown transfer coding", "POST /v1/begin HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400, "invalid-request"},
		} {
			resp, body, closed := exchange(t, dial, tt.raw)
			var p struct {
				Type   string
				Code   string
				Status int
				Detail string
			}
			if resp.StatusCode != tt.status || resp.Header.Get("Content-Type") != "application/problem+json" ||
				json.Unmarshal(body, &p) != nil || p.Type != "https://idemsvc.dev/problems/"+tt.kind || p.Code != tt.kind ||
				p.Status != tt.status || p.Detail == "" {
				t.Errorf("%s, %s: %d %s %s", scheme, tt.name, resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			if !closed {
				t.Errorf("%s, %s: the connection stayed open", scheme, tt.name)
			}
		}

		body := `{"key":"cl-te-` + scheme + `"}`
		smuggle := "POST /v1/begin HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 3\r\n" +
			"Transfer-Encoding: chunked\r\n\r\n" +
			strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n0\r\n\r\n"
		resp, answer, closed := exchange(t, dial, smuggle)
		if resp.StatusCode != http.StatusCreated || !closed {
			t.Errorf("%s, Content-Length with Transfer-Encoding: %d %s, closed %v; want 201 and the connection closed", scheme, resp.StatusCode, answer, closed)
		}
	}
}
