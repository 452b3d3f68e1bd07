// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/testpki"
)

// The API keys of the test's tenants: payments and shipping act for
// themselves, ops is an admin.
const (
	paymentsKey = "test-key-payments"
	shippingKey = "test-key-shipping"
	adminKey    = "test-key-ops-admin"
)

// chargeBody is the response body stored for completed keys.
const chargeBody = `{"id":"ch_1","amount":1000,"currency":"eur"}`

// startIdemsvc serves idemsvc, with the three tenants above, on a real
// loopback port until the test ends, and returns its URL.
func startIdemsvc(t *testing.T) string {
	t.Helper()
	return idemtest.Serve(t, handlers.Config{Keyring: tenants(t)}).URL
}

// tenants is the keyring of the three tenants above.
func tenants(t *testing.T) *auth.Keyring {
	return idemtest.Keyring(t, idemtest.Tenant{Name: "payments", Key: paymentsKey},
		idemtest.Tenant{Name: "shipping", Key: shippingKey}, idemtest.Tenant{Name: "ops", Key: adminKey, Admin: true})
}

// sdk is a client of the idemsvc at url with apiKey, to set up records.
func sdk(t *testing.T, url, apiKey string) *idem.Client {
	t.Helper()
	c, err := idem.New(url, idem.WithAPIKey(apiKey), idem.WithRetryBudget(0))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// begin acquires key for owner, with fingerprint, and returns the lease token.
func begin(t *testing.T, c *idem.Client, key, owner, fingerprint string) string {
	t.Helper()
	res, err := c.Begin(t.Context(), idem.BeginParams{Key: key, Owner: owner, Fingerprint: fingerprint})
	if err != nil {
		t.Fatalf("begin %s: %v", key, err)
	}
	if res.Lease == nil {
		t.Fatalf("begin %s: not acquired: %+v", key, res.Replay)
	}
	return res.Lease.LeaseToken
}

// complete begins key and completes it with resp.
func complete(t *testing.T, c *idem.Client, key string, resp idem.Response) {
	t.Helper()
	token := begin(t, c, key, "req-"+key, "sha256:"+key)
	if _, err := c.Complete(t.Context(), key, token, resp, 0); err != nil {
		t.Fatalf("complete %s: %v", key, err)
	}
}

// completeCharge completes key with a charge's 201 JSON response.
func completeCharge(t *testing.T, c *idem.Client, key string) {
	t.Helper()
	complete(t, c, key, idem.Response{StatusCode: 201,
		Headers: map[string]string{"Content-Type": "application/json", "Location": "/charges/ch_1"},
		Body:    []byte(chargeBody)})
}

// result is one run of idemctl.
type result struct {
	code           int
	stdout, stderr string
}

// idemctl runs the command with env and args.
func idemctl(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, env, &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

// as is the environment of an operator using apiKey against url.
func as(url, apiKey string) []string {
	return []string{"IDEMSVC_URL=" + url, "IDEMSVC_API_KEY=" + apiKey, "PATH=/usr/bin:/bin"}
}

func (r result) want(t *testing.T, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
}

// field is one "name: value" line of the human output.
type field struct {
	name, value string
	column      int // where the value starts
}

// parseFields reads the human output. A line starting with spaces
// continues the previous value.
func parseFields(t *testing.T, out string) []field {
	t.Helper()
	var fs []field
	for line := range strings.Lines(out) {
		line = strings.TrimSuffix(line, "\n")
		if strings.HasPrefix(line, " ") && len(fs) > 0 {
			last := &fs[len(fs)-1]
			if len(line) < last.column || strings.TrimSpace(line[:last.column]) != "" {
				t.Fatalf("continuation line %q is not aligned with its value at column %d", line, last.column)
			}
			last.value += "\n" + line[last.column:]
			continue
		}
		name, rest, ok := strings.Cut(line, ":")
		if !ok || strings.Contains(name, " ") {
			t.Fatalf("line %q is not \"name: value\"", line)
		}
		value := strings.TrimLeft(rest, " ")
		fs = append(fs, field{name, value, len(line) - len(value)})
	}
	if len(fs) == 0 {
		t.Fatalf("no fields in %q", out)
	}
	for _, f := range fs {
		if f.column != fs[0].column {
			t.Errorf("values not aligned: %q starts at column %d, %q at %d\n%s", f.name, f.column, fs[0].name, fs[0].column, out)
		}
	}
	return fs
}

// fieldMap is fs by name; repeated names (headers) join with " | ".
func fieldMap(fs []field) map[string]string {
	m := make(map[string]string)
	for _, f := range fs {
		if v, ok := m[f.name]; ok {
			m[f.name] = v + " | " + f.value
		} else {
			m[f.name] = f.value
		}
	}
	return m
}

func TestStatusCompleted(t *testing.T) {
	url := startIdemsvc(t)
	completeCharge(t, sdk(t, url, paymentsKey), "order-42/charge")

	r := idemctl(t, as(url, paymentsKey), "status", "order-42/charge")
	r.want(t, exitOK)
	if r.stderr != "" {
		t.Errorf("stderr: %q", r.stderr)
	}
	f := fieldMap(parseFields(t, r.stdout))
	for name, want := range map[string]string{
		"key":         "order-42/charge",
		"tenant":      "payments",
		"state":       "completed",
		"attempt":     "1",
		"owner":       "req-order-42/charge",
		"fingerprint": "sha256:order-42/charge",
	} {
		if f[name] != want {
			t.Errorf("%s = %q, want %q\n%s", name, f[name], want, r.stdout)
		}
	}
	for _, name := range []string{"created_at", "updated_at", "expires_at"} {
		ts, err := time.Parse(time.RFC3339, f[name])
		if err != nil {
			t.Errorf("%s = %q: %v", name, f[name], err)
			continue
		}
		if ts.Before(time.Now().Add(-time.Hour)) {
			t.Errorf("%s = %v: not this record's time", name, ts)
		}
	}
	for name := range f {
		if strings.HasPrefix(name, "response") || strings.HasPrefix(name, "lease") {
			t.Errorf("field %q shown for a completed key without --show-response", name)
		}
	}
}

func TestStatusJSON(t *testing.T) {
	url := startIdemsvc(t)
	completeCharge(t, sdk(t, url, paymentsKey), "order-43/charge")

	r := idemctl(t, as(url, paymentsKey), "status", "--json", "order-43/charge")
	r.want(t, exitOK)
	var m map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &m); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, r.stdout)
	}
	for name, want := range map[string]any{
		"key": "order-43/charge", "tenant": "payments", "state": "completed",
		"attempt": 1.0, "owner": "req-order-43/charge", "fingerprint": "sha256:order-43/charge",
	} {
		if m[name] != want {
			t.Errorf("%s = %#v, want %#v", name, m[name], want)
		}
	}
	for _, name := range []string{"created_at", "updated_at", "expires_at"} {
		s, _ := m[name].(string)
		if _, err := time.Parse("2006-01-02T15:04:05.000Z", s); err != nil {
			t.Errorf("%s = %#v: not the API's millisecond UTC time: %v", name, m[name], err)
		}
	}
	for _, absent := range []string{"response", "lease_expires_at", "lease_expired", "retryable", "error"} {
		if _, ok := m[absent]; ok {
			t.Errorf("%s present in %s", absent, r.stdout)
		}
	}

	// With --show-response the record carries the stored response as the
	// API gives it.
	r = idemctl(t, as(url, paymentsKey), "status", "order-43/charge", "--show-response", "--json")
	r.want(t, exitOK)
	var rec struct {
		State    string `json:"state"`
		Response struct {
			StatusCode   int               `json:"status_code"`
			Headers      map[string]string `json:"headers"`
			Body         string            `json:"body"`
			BodyEncoding string            `json:"body_encoding"`
		} `json:"response"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rec); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, r.stdout)
	}
	if rec.Response.StatusCode != 201 || rec.Response.Body != chargeBody || rec.Response.BodyEncoding != "text" ||
		rec.Response.Headers["Location"] != "/charges/ch_1" {
		t.Errorf("response = %+v\n%s", rec.Response, r.stdout)
	}
}

func TestShowResponse(t *testing.T) {
	url := startIdemsvc(t)
	c := sdk(t, url, paymentsKey)
	completeCharge(t, c, "order-44/charge")
	complete(t, c, "thumbnail-7", idem.Response{Headers: map[string]string{"Content-Type": "image/png"},
		Body: []byte{0x89, 'P', 'N', 'G', 0x00, 0xff}})
	complete(t, c, "report-9", idem.Response{StatusCode: 200, Body: []byte("line one\nline two\n")})
	complete(t, c, "msg-1", idem.Response{}) // a consumer that stores nothing

	r := idemctl(t, as(url, paymentsKey), "status", "order-44/charge", "--show-response")
	r.want(t, exitOK)
	f := fieldMap(parseFields(t, r.stdout))
	if f["response.body"] != chargeBody {
		t.Errorf("response.body = %q, want %q\n%s", f["response.body"], chargeBody, r.stdout)
	}
	if f["response.status_code"] != "201" {
		t.Errorf("response.status_code = %q", f["response.status_code"])
	}
	if want := "Content-Type: application/json | Location: /charges/ch_1"; f["response.header"] != want {
		t.Errorf("response.header = %q, want %q", f["response.header"], want)
	}
	if f["state"] != "completed" {
		t.Errorf("state = %q", f["state"])
	}

	// A binary body is shown as base64, and says so.
	r = idemctl(t, as(url, paymentsKey), "status", "thumbnail-7", "--show-response")
	r.want(t, exitOK)
	f = fieldMap(parseFields(t, r.stdout))
	if want := "(binary, 6 bytes, shown as base64) iVBORwD/"; f["response.body"] != want {
		t.Errorf("binary response.body = %q, want %q", f["response.body"], want)
	}
	if _, ok := f["response.status_code"]; ok {
		t.Errorf("response.status_code shown though none was stored:\n%s", r.stdout)
	}

	// A body of several lines keeps its lines, aligned under the first.
	r = idemctl(t, as(url, paymentsKey), "status", "report-9", "--show-response")
	r.want(t, exitOK)
	f = fieldMap(parseFields(t, r.stdout))
	if f["response.body"] != "line one\nline two" {
		t.Errorf("multi-line response.body = %q\n%s", f["response.body"], r.stdout)
	}

	r = idemctl(t, as(url, paymentsKey), "status", "msg-1", "--show-response")
	r.want(t, exitOK)
	if f = fieldMap(parseFields(t, r.stdout)); f["response"] != "(none stored)" {
		t.Errorf("empty response shown as %q\n%s", f["response"], r.stdout)
	}
}

func TestStatusInProgressAndFailed(t *testing.T) {
	url := startIdemsvc(t)
	c := sdk(t, url, paymentsKey)
	begin(t, c, "order-45/charge", "worker-3", "")
	token := begin(t, c, "order-46/charge", "worker-4", "")
	if _, err := c.Fail(t.Context(), "order-46/charge", token, idem.FailParams{Terminal: true, Error: "card declined"}); err != nil {
		t.Fatal(err)
	}

	r := idemctl(t, as(url, paymentsKey), "status", "order-45/charge")
	r.want(t, exitOK)
	f := fieldMap(parseFields(t, r.stdout))
	if f["state"] != "in_progress" || f["owner"] != "worker-3" || f["lease_expired"] != "false" {
		t.Errorf("in progress:\n%s", r.stdout)
	}
	if _, err := time.Parse(time.RFC3339, f["lease_expires_at"]); err != nil {
		t.Errorf("lease_expires_at = %q: %v", f["lease_expires_at"], err)
	}
	if _, ok := f["fingerprint"]; ok {
		t.Errorf("fingerprint shown though the begin gave none:\n%s", r.stdout)
	}

	r = idemctl(t, as(url, paymentsKey), "status", "order-46/charge")
	r.want(t, exitOK)
	f = fieldMap(parseFields(t, r.stdout))
	if f["state"] != "failed" || f["retryable"] != "false" || f["error"] != "card declined" {
		t.Errorf("failed:\n%s", r.stdout)
	}
}

func TestStatusNotFound(t *testing.T) {
	url := startIdemsvc(t)
	for _, args := range [][]string{
		{"status", "never-begun"},
		{"status", "never-begun", "--json"},
		{"status", "never-begun", "--show-response"},
	} {
		r := idemctl(t, as(url, paymentsKey), args...)
		r.want(t, exitNotFound)
		if r.stdout != "" {
			t.Errorf("%q: stdout %q", args, r.stdout)
		}
		if !strings.Contains(r.stderr, "never-begun") || !strings.Contains(r.stderr, "404") {
			t.Errorf("%q: stderr %q does not name the key and the 404", args, r.stderr)
		}
	}
}

func TestDelete(t *testing.T) {
	url := startIdemsvc(t)
	c := sdk(t, url, paymentsKey)
	completeCharge(t, c, "order-47/charge")
	completeCharge(t, c, "order-48/charge")
	env := as(url, paymentsKey)

	idemctl(t, env, "status", "order-47/charge").want(t, exitOK)
	r := idemctl(t, env, "delete", "order-47/charge")
	r.want(t, exitOK)
	f := fieldMap(parseFields(t, r.stdout))
	if f["key"] != "order-47/charge" || f["deleted"] != "true" {
		t.Errorf("delete printed:\n%s", r.stdout)
	}
	idemctl(t, env, "status", "order-47/charge").want(t, exitNotFound)
	idemctl(t, env, "status", "order-48/charge").want(t, exitOK) // only the named key went

	// The key is new again: the next begin acquires it.
	res, err := c.Begin(t.Context(), idem.BeginParams{Key: "order-47/charge"})
	if err != nil || res.Lease == nil {
		t.Fatalf("begin after delete = %+v, %v; want acquired", res, err)
	}

	r = idemctl(t, env, "--json", "delete", "order-48/charge")
	r.want(t, exitOK)
	var out struct {
		Deleted *bool  `json:"deleted"`
		Key     string `json:"key"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Deleted == nil || !*out.Deleted || out.Key != "order-48/charge" {
		t.Errorf("delete --json = %q (%v)", r.stdout, err)
	}
	idemctl(t, env, "status", "order-48/charge").want(t, exitNotFound)

	// Deleting an absent record exits 3, as status of it does, and does
	// not claim a deletion.
	r = idemctl(t, env, "delete", "order-48/charge")
	r.want(t, exitNotFound)
	if f := fieldMap(parseFields(t, r.stdout)); f["deleted"] != "false (no record)" {
		t.Errorf("delete of an absent key printed %q", r.stdout)
	}
	r = idemctl(t, env, "--json", "delete", "never-existed")
	r.want(t, exitNotFound)
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Deleted == nil || *out.Deleted {
		t.Errorf("delete --json of an absent key = %q (%v)", r.stdout, err)
	}
}

func TestWrongAPIKey(t *testing.T) {
	url := startIdemsvc(t)
	completeCharge(t, sdk(t, url, paymentsKey), "order-49/charge")

	for name, env := range map[string][]string{
		"wrong key": as(url, "not-a-key"),
		"no key":    {"IDEMSVC_URL=" + url},
	} {
		for _, cmd := range []string{"status", "delete"} {
			r := idemctl(t, env, cmd, "order-49/charge")
			r.want(t, exitError)
			if !strings.Contains(r.stderr, "401") || !strings.Contains(r.stderr, "IDEMSVC_API_KEY") {
				t.Errorf("%s, %s: stderr %q, want the 401 and a hint", name, cmd, r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("%s, %s: stdout %q", name, cmd, r.stdout)
			}
		}
	}
	// --api-key overrides the environment, and the record is still there.
	idemctl(t, as(url, "not-a-key"), "status", "order-49/charge", "--api-key", paymentsKey).want(t, exitOK)
}

func TestAdminActsForTenant(t *testing.T) {
	url := startIdemsvc(t)
	completeCharge(t, sdk(t, url, paymentsKey), "order-50/charge")
	admin := as(url, adminKey)

	r := idemctl(t, admin, "status", "order-50/charge", "--tenant", "payments")
	r.want(t, exitOK)
	if f := fieldMap(parseFields(t, r.stdout)); f["tenant"] != "payments" || f["state"] != "completed" {
		t.Errorf("admin status for payments:\n%s", r.stdout)
	}
	// Without --tenant the admin reads its own tenant, which has no such key.
	idemctl(t, admin, "status", "order-50/charge").want(t, exitNotFound)
	// Another tenant's record of the same key is another record.
	idemctl(t, admin, "status", "order-50/charge", "--tenant", "shipping").want(t, exitNotFound)

	r = idemctl(t, admin, "delete", "--tenant=payments", "order-50/charge", "--json")
	r.want(t, exitOK)
	var out map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out["tenant"] != "payments" || out["deleted"] != true {
		t.Errorf("admin delete --json = %q (%v)", r.stdout, err)
	}
	idemctl(t, as(url, paymentsKey), "status", "order-50/charge").want(t, exitNotFound)
}

// A tenant the tenants file does not list is an error (1), not a key
// without a record (3), for every command; the message names it.
func TestUnknownTenant(t *testing.T) {
	url := startIdemsvc(t)
	admin := as(url, adminKey)
	for _, args := range [][]string{
		{"status", "order-52/charge", "--tenant", "nosuch"},
		{"delete", "order-52/charge", "--tenant", "nosuch"},
		{"delete", "order-52/charge", "--tenant", "nosuch", "--json"},
		{"list", "--state", "completed", "--tenant", "nosuch"},
	} {
		r := idemctl(t, admin, args...)
		r.want(t, exitError)
		if !strings.Contains(r.stderr, `tenant "nosuch"`) || !strings.Contains(r.stderr, "tenants file") {
			t.Errorf("%v: stderr %q, want the unknown tenant named", args, r.stderr)
		}
	}
	// A known tenant without the record is still 3.
	idemctl(t, admin, "delete", "order-52/charge", "--tenant", "shipping").want(t, exitNotFound)
}

func TestTenantKeyNamingAnotherTenant(t *testing.T) {
	url := startIdemsvc(t)
	completeCharge(t, sdk(t, url, paymentsKey), "order-51/charge")
	payments := as(url, paymentsKey)

	for _, cmd := range []string{"status", "delete"} {
		r := idemctl(t, payments, cmd, "order-51/charge", "--tenant", "shipping")
		r.want(t, exitError)
		if !strings.Contains(r.stderr, "403") || !strings.Contains(r.stderr, "this API key acts for its own tenant only") {
			t.Errorf("%s: stderr %q, want the 403 and its reason", cmd, r.stderr)
		}
	}
	// Naming its own tenant is fine, and the refused delete changed nothing.
	idemctl(t, payments, "status", "order-51/charge", "--tenant", "payments").want(t, exitOK)
	// The shipping tenant's key does not see payments' record.
	idemctl(t, as(url, shippingKey), "status", "order-51/charge").want(t, exitNotFound)
	idemctl(t, as(url, shippingKey), "status", "order-51/charge", "--tenant", "payments").want(t, exitError)
}

func TestFlagsAnywhere(t *testing.T) {
	url := startIdemsvc(t)
	c := sdk(t, url, paymentsKey)
	completeCharge(t, c, "order-52/charge")
	odd := `-odd{key}*?\`
	completeCharge(t, c, odd)
	env := []string{"IDEMSVC_URL=http://127.0.0.1:1"} // wrong on purpose: the flag overrides it

	for _, args := range [][]string{
		{"--url", url, "--api-key", paymentsKey, "status", "order-52/charge", "--json"},
		{"status", "--url", url, "order-52/charge", "--api-key=" + paymentsKey, "--json"},
		{"status", "order-52/charge", "--json", "--url=" + url, "-api-key", paymentsKey},
		{"--json", "status", "--url", url, "--api-key", paymentsKey, "--", odd},
	} {
		r := idemctl(t, env, args...)
		r.want(t, exitOK)
		var m map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &m); err != nil || m["state"] != "completed" {
			t.Errorf("%q: stdout %q (%v)", args, r.stdout, err)
		}
		if want := args[len(args)-1]; want == odd && m["key"] != odd {
			t.Errorf("%q: key = %v, want %q", args, m["key"], odd)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	url := startIdemsvc(t)
	env := as(url, paymentsKey)
	for name, args := range map[string][]string{
		"nothing":                 nil,
		"unknown command":         {"show", "k"},
		"no key":                  {"status"},
		"two keys":                {"status", "a", "b"},
		"unknown flag":            {"status", "k", "--verbose"},
		"flag without value":      {"status", "k", "--tenant"},
		"show-response on delete": {"delete", "k", "--show-response"},
		"bad url":                 {"status", "k", "--url", "idemsvc:8080"},
		"empty key":               {"status", ""},
		"bad timeout":             {"status", "k", "--timeout", "soon"},
	} {
		r := idemctl(t, env, args...)
		if r.code != exitError {
			t.Errorf("%s: exit %d, want %d", name, r.code, exitError)
		}
		if !strings.Contains(r.stderr, "usage:") || r.stdout != "" {
			t.Errorf("%s: want the usage on stderr only; stdout %q, stderr %q", name, r.stdout, r.stderr)
		}
	}
	for _, args := range [][]string{{"help"}, {"-h"}, {"status", "--help"}} {
		r := idemctl(t, env, args...)
		r.want(t, exitOK)
		if !strings.Contains(r.stdout, "usage:") {
			t.Errorf("%q: stdout %q, want the usage", args, r.stdout)
		}
	}
}

func TestUnreachable(t *testing.T) {
	srv := httptest.NewServer(nil)
	url := srv.URL
	srv.Close() // nothing listens there now
	r := idemctl(t, as(url, paymentsKey), "status", "k", "--timeout", "300ms")
	r.want(t, exitError) // an error, not "not found"
	if !strings.Contains(r.stderr, "status k") {
		t.Errorf("stderr %q", r.stderr)
	}
}

// list finds the keys stuck in progress, as lines or JSON lines, and
// honours --limit and --older-than; bad list flags are usage errors.
func TestList(t *testing.T) {
	url := startIdemsvc(t)
	payments := sdk(t, url, paymentsKey)
	for i := range 5 {
		begin(t, payments, fmt.Sprintf("stuck-%d", i), "worker-1", "")
	}
	completeCharge(t, payments, "paid")
	env := as(url, paymentsKey)

	r := idemctl(t, env, "list", "--state", "in_progress")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != exitOK || len(lines) != 5 || !strings.HasPrefix(lines[0], "stuck-0  attempt 1  updated ") ||
		!strings.Contains(lines[0], "lease until ") || !strings.HasSuffix(lines[0], "owner worker-1") {
		t.Fatalf("list = %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = idemctl(t, env, "list", "--state", "completed", "--json")
	var rec idem.StatusRecord
	if err := json.Unmarshal([]byte(r.stdout), &rec); err != nil || rec.Key != "paid" || rec.State != idem.StateCompleted {
		t.Errorf("list --json = %q: %+v, %v", r.stdout, rec, err)
	}
	if r = idemctl(t, env, "list", "--state", "in_progress", "--limit", "2", "--json"); strings.Count(r.stdout, "\n") != 2 {
		t.Errorf("--limit 2 printed %q", r.stdout)
	}
	if r = idemctl(t, env, "list", "--state", "in_progress", "--older-than", "1h"); r.code != exitOK || r.stdout != "" {
		t.Errorf("--older-than 1h = %d %q", r.code, r.stdout)
	}
	for _, args := range [][]string{
		{"list"},
		{"list", "--state", "stuck"},
		{"list", "--state", "failed", "some-key"},
		{"status", "k", "--state", "failed"},
	} {
		if r := idemctl(t, env, args...); r.code != exitError || !strings.Contains(r.stderr, "usage:") {
			t.Errorf("%q = %d %q, want a usage error", args, r.code, r.stderr)
		}
	}
}

// idemctl reaches an idemsvc that serves HTTPS and requires client
// certificates with --ca-file, --cert-file and --key-file, or the same
// from the environment.
func TestClientCertificates(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "idemsvc test CA")
	caFile := ca.Write(t, dir, "ca")
	certFile, keyFile := ca.Issue(t, "idemctl").Write(t, dir, "idemctl")
	srv := httptest.NewUnstartedServer(handlers.New(handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()), Keyring: tenants(t)}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "idemsvc").TLS(t)}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	status := func(args []string, env ...string) (int, string) {
		var stdout, stderr strings.Builder
		code := run(t.Context(), append([]string{"status", "nothing-here", "--url", srv.URL, "--api-key", paymentsKey, "--timeout", "2s"}, args...), env, &stdout, &stderr)
		return code, stderr.String()
	}
	if code, stderr := status([]string{"--ca-file", caFile, "--cert-file", certFile, "--key-file", keyFile}); code != exitNotFound {
		t.Errorf("with the CA and a client certificate: exit %d, %s; want %d (no record)", code, stderr, exitNotFound)
	}
	if code, stderr := status(nil, "IDEMSVC_CA_FILE="+caFile, "IDEMSVC_CLIENT_CERT_FILE="+certFile, "IDEMSVC_CLIENT_KEY_FILE="+keyFile); code != exitNotFound {
		t.Errorf("with the same from the environment: exit %d, %s", code, stderr)
	}
	if code, _ := status([]string{"--ca-file", caFile}); code != exitError {
		t.Errorf("without a client certificate: exit %d, want %d", code, exitError)
	}
	if code, _ := status(nil); code != exitError {
		t.Errorf("without the CA: exit %d, want %d", code, exitError)
	}
}

// usage prints a line per tenant the key may see; --json the API's objects.
func TestUsageCommand(t *testing.T) {
	url := startIdemsvc(t)
	begin(t, sdk(t, url, paymentsKey), "order-60/charge", "req-60", "")

	r := idemctl(t, as(url, adminKey), "usage")
	r.want(t, exitOK)
	var tenants []string
	for line := range strings.Lines(r.stdout) {
		name, _, _ := strings.Cut(line, " ")
		tenants = append(tenants, name)
		if !strings.Contains(line, "begins/s ") || !strings.Contains(line, "stored_bytes ") || !strings.Contains(line, "rejections ") {
			t.Errorf("usage line %q", line)
		}
	}
	if strings.Join(tenants, ",") != "ops,payments,shipping" {
		t.Errorf("admin usage lists %v, want every tenant\n%s", tenants, r.stdout)
	}

	r = idemctl(t, as(url, paymentsKey), "usage", "--json")
	r.want(t, exitOK)
	var u idem.TenantUsage
	if err := json.Unmarshal([]byte(r.stdout), &u); err != nil || u.Tenant != "payments" {
		t.Errorf("tenant usage --json = %q (%v), want payments alone", r.stdout, err)
	}
	idemctl(t, as(url, paymentsKey), "usage", "--tenant", "shipping").want(t, exitError)
	idemctl(t, as(url, paymentsKey), "usage", "order-60/charge").want(t, exitError)
}
