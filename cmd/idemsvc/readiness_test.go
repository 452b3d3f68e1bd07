// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

// TestReadyzRefusals: a Redis that refuses idemsvc's credentials, or
// whose ACL user may not run scripts or write, fails /readyz with auth or
// permissions, naming the node, and logs it as an error; it is not taken
// for a Redis that hides CONFIG and INFO. Begins get 503 meanwhile.
func TestReadyzRefusals(t *testing.T) {
	srv := redistest.NewPrivateServer(t) // its users change
	admin := srv.Client(t)
	for user, rules := range map[string][]any{
		"idem":     {"~*", "&*", "+@all"},
		"noscript": {"~*", "&*", "+@all", "-@scripting"},
		"readonly": {"~*", "&*", "+@all", "-@write"},
	} {
		if err := admin.Do(context.Background(), append([]any{"ACL", "SETUSER", user, "on", ">right"}, rules...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name, user, password, check, logged string
	}{
		{"wrong password", "idem", "wrong", "auth", "refuses idemsvc's credentials"},
		{"no scripting", "noscript", "right", "permissions", "may not send what idemsvc sends"},
		{"read-only", "readonly", "right", "permissions", "may not send what idemsvc sends"},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := start(t, []string{"--insecure-no-auth"}, []string{"IDEMSVC_REDIS_URL=redis://" + srv.Addr(),
				"IDEMSVC_REDIS_USERNAME=" + c.user, "IDEMSVC_REDIS_PASSWORD=" + c.password})
			began := time.Now()
			code, body := readyz(t, in.url)
			if elapsed := time.Since(began); elapsed > 900*time.Millisecond { // 500 ms, with a margin for a loaded machine
				t.Errorf("readyz took %v", elapsed)
			}
			var answer struct {
				Failures []struct{ Check, Node, Detail string }
			}
			_ = json.Unmarshal([]byte(body), &answer)
			if code != http.StatusServiceUnavailable || len(answer.Failures) != 1 || answer.Failures[0].Check != c.check ||
				answer.Failures[0].Node != srv.Addr() {
				t.Errorf("readyz = %d %s, want 503 failing %s on %s", code, body, c.check, srv.Addr())
			}
			if strings.Contains(body, c.password) {
				t.Errorf("readyz shows the password: %s", body)
			}
			if code, body := post(t, in.url+"/v1/begin", "", `{"key":"refused"}`); code != http.StatusServiceUnavailable {
				t.Errorf("begin = %d %v, want 503", code, body)
			}
			logs := in.logs.String()
			if !in.logs.logged("ERROR", "") || !strings.Contains(logs, c.logged) || strings.Contains(logs, "CONFIG and INFO hidden") {
				t.Errorf("no error logged that %s, or a Redis taken for one that hides INFO:\n%s", c.logged, logs)
			}
		})
	}
}

// TestPolicyChangedWhileServing (contract, "A Redis that forgets"): after
// the policy changes to an evicting one, begins that would acquire get 503
// store-unavailable with Retry-After, completed keys still replay, and
// begins acquire again once the policy is noeviction.
func TestPolicyChangedWhileServing(t *testing.T) {
	setRoomInterval(t, 50*time.Millisecond)
	srv := redistest.NewPrivateServer(t) // its configuration changes
	in := start(t, []string{"--insecure-no-auth"}, []string{"IDEMSVC_REDIS_URL=redis://" + srv.Addr()})
	completeKey(t, in.url, "done")
	next := newKeys()

	setPolicy(t, srv.Client(t), "allkeys-lru")
	idemtest.Eventually(t, 5*time.Second, "begins refused on the evicting master", func() bool {
		code, _, _ := call(t, in.url+"/v1/begin", `{"key":"`+next()+`"}`)
		return code == http.StatusServiceUnavailable
	})
	wantRefusedBegin(t, in.url, `{"key":"`+next()+`"}`)
	if code, _, body := call(t, in.url+"/v1/begin", `{"key":"done"}`); code != http.StatusOK || !strings.Contains(body, `"paid"`) {
		t.Errorf("begin of a completed key = %d %s, want its replay", code, body)
	}
	if logs := in.logs.String(); !strings.Contains(logs, "begins that would start an operation on a Redis master are refused") ||
		!strings.Contains(logs, "allkeys-lru") {
		t.Errorf("the refusal is not logged with its reason:\n%s", logs)
	}

	setPolicy(t, srv.Client(t), "noeviction")
	idemtest.Eventually(t, 5*time.Second, "begins acquire once the policy is noeviction", func() bool {
		code, _, _ := call(t, in.url+"/v1/begin", `{"key":"`+next()+`"}`)
		return code == http.StatusCreated
	})
}

// TestReserveRefusesBegins (contract, "Room for outcomes"): with less free
// memory under maxmemory than IDEMSVC_REDIS_RESERVE_BYTES, begins that
// would acquire get 503 with Retry-After and /readyz fails with reserve,
// while an attempt already running completes; the headroom is a metric.
// Here maxmemory (32 MiB) is under the reserve (64 MiB, the default).
func TestReserveRefusesBegins(t *testing.T) {
	setRoomInterval(t, 50*time.Millisecond)
	srv := redistest.NewPrivateServer(t) // its configuration changes
	admin := srv.Client(t)
	in := start(t, []string{"--insecure-no-auth"}, []string{"IDEMSVC_REDIS_URL=redis://" + srv.Addr()})
	completeKey(t, in.url, "done")
	next := newKeys()
	code, _, body := call(t, in.url+"/v1/begin", `{"key":"running"}`)
	if code != http.StatusCreated {
		t.Fatalf("begin = %d %s", code, body)
	}
	var lease struct {
		LeaseToken string `json:"lease_token"`
	}
	_ = json.Unmarshal([]byte(body), &lease)

	if err := admin.ConfigSet(context.Background(), "maxmemory", "32mb").Err(); err != nil {
		t.Fatal(err)
	}
	idemtest.Eventually(t, 5*time.Second, "begins refused under the reserve", func() bool {
		code, _, _ := call(t, in.url+"/v1/begin", `{"key":"`+next()+`"}`)
		return code == http.StatusServiceUnavailable
	})
	wantRefusedBegin(t, in.url, `{"key":"`+next()+`"}`)
	if code, body := readyz(t, in.url); code != http.StatusServiceUnavailable || !strings.Contains(body, `"check":"reserve"`) ||
		!strings.Contains(body, srv.Addr()) {
		t.Errorf("readyz = %d %s, want 503 failing reserve on %s", code, body, srv.Addr())
	}
	if code, _, body := call(t, in.url+"/v1/begin", `{"key":"done"}`); code != http.StatusOK {
		t.Errorf("begin of a completed key = %d %s, want its replay", code, body)
	}
	if code, _, body := call(t, in.url+"/v1/complete", `{"key":"running","lease_token":"`+lease.LeaseToken+
		`","response":{"status_code":201,"body":"`+strings.Repeat("x", 64<<10)+`"}}`); code != http.StatusOK {
		t.Errorf("complete of the attempt already running = %d %s", code, body)
	}
	if metrics := get(t, in.url+"/metrics"); !strings.Contains(metrics, `idemsvc_redis_headroom_bytes{node="`+srv.Addr()+`"} `) {
		t.Errorf("no idemsvc_redis_headroom_bytes for %s in the metrics", srv.Addr())
	}

	if err := admin.ConfigSet(context.Background(), "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	idemtest.Eventually(t, 5*time.Second, "begins acquire without maxmemory", func() bool {
		code, _, _ := call(t, in.url+"/v1/begin", `{"key":"`+next()+`"}`)
		return code == http.StatusCreated
	})
	if metrics := get(t, in.url+"/metrics"); !strings.Contains(metrics, `idemsvc_redis_headroom_bytes{node="`+srv.Addr()+`"} +Inf`) {
		t.Errorf("headroom without maxmemory is not +Inf:\n%s", metrics)
	}
}

// newKeys returns a function that returns a new key each time.
func newKeys() func() string {
	n := 0
	return func() string {
		n++
		return "new-" + strconv.Itoa(n)
	}
}

// call POSTs body to url without an API key and returns the status, the
// headers and the body.
func call(t *testing.T, url, body string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(out)
}

// completeKey begins and completes key with the body "paid".
func completeKey(t *testing.T, url, key string) {
	t.Helper()
	code, _, body := call(t, url+"/v1/begin", `{"key":"`+key+`"}`)
	var lease struct {
		LeaseToken string `json:"lease_token"`
	}
	if err := json.Unmarshal([]byte(body), &lease); code != http.StatusCreated || err != nil {
		t.Fatalf("begin = %d %s", code, body)
	}
	code, _, body = call(t, url+"/v1/complete", `{"key":"`+key+`","lease_token":"`+lease.LeaseToken+`","response":{"status_code":201,"body":"paid"}}`)
	if code != http.StatusOK {
		t.Fatalf("complete = %d %s", code, body)
	}
}

// wantRefusedBegin checks that a begin gets 503 store-unavailable with
// Retry-After.
func wantRefusedBegin(t *testing.T, url, body string) {
	t.Helper()
	code, header, answer := call(t, url+"/v1/begin", body)
	if code != http.StatusServiceUnavailable || header.Get("Retry-After") == "" ||
		!strings.Contains(answer, `"type":"https://idemsvc.dev/problems/store-unavailable"`) {
		t.Errorf("begin = %d (Retry-After %q) %s, want 503 store-unavailable with Retry-After", code, header.Get("Retry-After"), answer)
	}
}

// setRoomInterval sets how often the instances the test starts after it
// read each master's memory and policy, and restores it once they stopped.
func setRoomInterval(t *testing.T, every time.Duration) {
	old := roomCheckInterval
	t.Cleanup(func() { roomCheckInterval = old })
	roomCheckInterval = every
}

// A begin refused for the reserve changed nothing, so it holds none of its
// tenant's in_progress: after the gate opens again the tenant acquires at
// once. A tenant at its in_progress limit while the gate is shut gets its
// 429, which says when to come back, rather than the master's 503.
func TestReserveRefusalsHoldNoLeases(t *testing.T) {
	setRoomInterval(t, 50*time.Millisecond)
	srv := redistest.NewPrivateServer(t) // its configuration changes
	admin := srv.Client(t)
	tenants := idemtest.WriteTenantsFile(t, idemtest.TenantsYAMLWithDefaults("",
		idemtest.Tenant{Name: "one", Key: "key-one", Limits: "{in_progress: 1}"},
		idemtest.Tenant{Name: "full", Key: "key-full", Limits: "{in_progress: 1}"},
		idemtest.Tenant{Name: "probe", Key: "key-probe"}))
	probe := newKeys()
	in := start(t, []string{"--tenants-file", tenants}, []string{"IDEMSVC_REDIS_URL=redis://" + srv.Addr()})
	if code, body := post(t, in.url+"/v1/begin", "key-full", `{"key":"held"}`); code != http.StatusCreated {
		t.Fatalf("full's begin = %d %s", code, body)
	}

	if err := admin.ConfigSet(context.Background(), "maxmemory", "32mb").Err(); err != nil {
		t.Fatal(err)
	}
	idemtest.Eventually(t, 5*time.Second, "begins refused under the reserve", func() bool {
		code, _ := post(t, in.url+"/v1/begin", "key-probe", `{"key":"`+probe()+`"}`)
		return code == http.StatusServiceUnavailable
	})
	if code, body := post(t, in.url+"/v1/begin", "key-one", `{"key":"refused"}`); code != http.StatusServiceUnavailable {
		t.Fatalf("begin under the reserve = %d %s, want 503", code, body)
	}
	if code, body := post(t, in.url+"/v1/begin", "key-full", `{"key":"another"}`); code != http.StatusTooManyRequests {
		t.Errorf("a tenant at its in_progress limit under the reserve = %d %s, want its 429", code, body)
	}

	if err := admin.ConfigSet(context.Background(), "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	idemtest.Eventually(t, 5*time.Second, "the gate opens", func() bool {
		code, _ := post(t, in.url+"/v1/begin", "key-full", `{"key":"another"}`)
		return code == http.StatusTooManyRequests // full still holds its one lease; the gate no longer answers
	})
	// The refused begin's reservation goes with the limiter's next flush
	// (about a second), not with its lease (30 s).
	idemtest.Eventually(t, 5*time.Second, "the refused begin holds no in_progress", func() bool {
		code, _ := post(t, in.url+"/v1/begin", "key-one", `{"key":"after"}`)
		return code == http.StatusCreated
	})
}
