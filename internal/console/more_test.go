// SPDX-License-Identifier: Apache-2.0

package console_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/accessibility"
	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/security"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/blob"
	"github.com/idemsvc/idemsvc/internal/console"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/statemachine"
	"github.com/idemsvc/idemsvc/internal/testkit/s3test"
	"github.com/idemsvc/idemsvc/internal/testkit/testpki"
)

// other serves a second idemsvc with the console, for one tenant, in the
// shared browser: over TLS when tlsConfig is set, with a blob store when
// blobs is. It returns the site as the tabs see it, and a client of it.
func (s *site) other(t *testing.T, tlsConfig *tls.Config, blobs *handlers.BlobConfig) (*site, *idem.Client) {
	t.Helper()
	key := "sk-console-other-" + tenantA
	keyring, err := auth.Parse(fmt.Appendf(nil, "tenants:\n  - name: %s\n    api_key_sha256: [%q]\n", tenantA, auth.Digest(key)))
	if err != nil {
		t.Fatal(err)
	}
	svc := handlers.New(handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits()), Keyring: keyring, Blob: blobs})
	srv := httptest.NewUnstartedServer(console.Handler(svc))
	if tlsConfig != nil {
		srv.TLS = tlsConfig
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	t.Cleanup(svc.StopWaiting)
	other := *s
	other.url = srv.URL
	other.keys = map[string]string{tenantA: key}
	opts := []idem.Option{idem.WithAPIKey(key)}
	if tlsConfig != nil {
		opts = append(opts, idem.WithTLS(srv.Client().Transport.(*http.Transport).TLSClientConfig))
	}
	c, err := idem.New(srv.URL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return &other, c
}

// complete begins key and completes it with body: inline, or as a stream
// (kept in the blob store by reference when it is over 1 MiB).
func complete(t *testing.T, c *idem.Client, key string, body []byte, stream bool) {
	t.Helper()
	ctx := context.Background()
	r, err := c.Begin(ctx, idem.BeginParams{Key: key, Owner: "worker", Lease: time.Minute})
	if err != nil || r.Lease == nil {
		t.Fatalf("begin %s: %+v, %v", key, r, err)
	}
	headers := map[string]string{"Content-Type": "text/plain; charset=utf-8"}
	if stream {
		_, err = c.CompleteStream(ctx, key, r.Lease.LeaseToken, 200, headers, bytes.NewReader(body), 0)
	} else {
		_, err = c.Complete(ctx, key, r.Lease.LeaseToken, idem.Response{StatusCode: 200, Headers: headers, Body: body}, 0)
	}
	if err != nil {
		t.Fatalf("complete %s: %v", key, err)
	}
}

// download clicks the record's download link and returns the file the
// browser saved.
func (tb *tab) download(dir string) []byte {
	tb.t.Helper()
	tb.run(browser.SetDownloadBehavior(browser.SetDownloadBehaviorBehaviorAllowAndName).WithDownloadPath(dir).WithEventsEnabled(true))
	var saved string
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(tb.ctx)
	defer cancel()
	chromedp.ListenTarget(ctx, func(ev any) {
		if e, ok := ev.(*browser.EventDownloadProgress); ok && e.State == browser.DownloadProgressStateCompleted && saved == "" {
			saved = filepath.Join(dir, e.GUID)
			close(done)
		}
	})
	tb.run(chromedp.Click("#download", chromedp.ByID))
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		tb.t.Fatal("the download did not complete within 30 s")
	}
	data, err := os.ReadFile(saved)
	if err != nil {
		tb.t.Fatal(err)
	}
	return data
}

// A record's body kept in the blob store by reference (over the JSON
// answers' 1 MiB) shows its first 64 KiB, cut where a character would be,
// and downloads whole from GET /v1/keys/body; an inline body downloads
// whole too.
func TestConsoleBodyByReference(t *testing.T) {
	s := getSite(t)
	st3 := s3test.New(t)
	st3.Setenv(t)
	store, err := blob.Open(context.Background(), blob.Config{URL: st3.URL("console"), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	other, c := s.other(t, nil, &handlers.BlobConfig{Store: store, SpoolDir: t.TempDir()})

	// 65,535 bytes of 'a', then a character of two bytes across the 64 KiB
	// shown, then lines to 1.5 MiB.
	var large bytes.Buffer
	large.WriteString(strings.Repeat("a", 65535) + "é\n")
	for i := 0; large.Len() < 3<<19; i++ {
		fmt.Fprintf(&large, "line %07d of a large stored body\n", i)
	}
	large.WriteString("the end\n")
	body := large.Bytes()
	sum := sha256.Sum256(body)
	complete(t, c, "large", body, true)
	rec, err := c.Status(context.Background(), "large", true)
	if err != nil || rec.Response == nil || rec.Response.BodyRef == nil {
		t.Fatalf("the large record is not kept by reference: %+v, %v", rec, err)
	}
	small := []byte("a small body, kept in the record\n")
	complete(t, c, "small", small, false)

	tb := other.newTab(t)
	tb.signIn(tenantA)
	tb.run(chromedp.Navigate(other.url+"/console/#/record?tenant="+tenantA+"&key=large"), chromedp.WaitVisible("#response", chromedp.ByID))
	fields := tb.recordFields("large")
	if fields["State"] != "completed" {
		t.Errorf("record %v", fields)
	}
	tb.until(`document.getElementById('body').textContent.length > 0`)
	if shown := tb.text("#body"); shown != strings.Repeat("a", 65535) {
		t.Errorf("body shown: %d characters beginning %.40q and ending %q, want the 65,535 'a's before the character cut",
			len(shown), shown, shown[max(0, len(shown)-10):])
	}
	var view string
	tb.eval(`document.getElementById('body-view').value`, &view)
	if view != "text" {
		t.Errorf("body shown as %s, want text", view)
	}
	var cut string
	tb.eval(`document.getElementById('body-cut').hidden ? '' : document.getElementById('body-cut').textContent`, &cut)
	if !strings.Contains(cut, strconv.Itoa(len(body))) {
		t.Errorf("the cut is not said with the body's size %d: %q", len(body), cut)
	}
	if got := tb.text("#download"); !strings.Contains(got, strconv.Itoa(len(body))+" bytes") {
		t.Errorf("download link %q does not give the size %d", got, len(body))
	}
	var sha string
	tb.eval(`Array.from(document.querySelectorAll('#response-fields dt')).find(dt => dt.textContent === 'Body SHA-256')?.nextElementSibling.textContent ?? ''`, &sha)
	if sha != hex.EncodeToString(sum[:]) {
		t.Errorf("SHA-256 shown %q, want %x", sha, sum)
	}
	tb.readme("console-large-body.png")
	got := tb.download(t.TempDir())
	if !bytes.Equal(got, body) {
		t.Errorf("downloaded %d bytes (SHA-256 %x), want the body's %d (%x)", len(got), sha256.Sum256(got), len(body), sum)
	}

	tb.run(chromedp.Navigate(other.url+"/console/#/record?tenant="+tenantA+"&key=small"), chromedp.WaitVisible("#response", chromedp.ByID))
	tb.recordFields("small")
	tb.until(`document.getElementById('body').textContent === ` + strconv.Quote(string(small)))
	if got := tb.download(t.TempDir()); !bytes.Equal(got, small) {
		t.Errorf("downloaded %q, want %q", got, small)
	}
	tb.requireOnlyOwnOrigin()
}

// The console works over TLS as the API does: signed in over HTTPS, it
// lists and reads records.
func TestConsoleOverTLS(t *testing.T) {
	s := getSite(t)
	ca := testpki.NewCA(t, "console test CA")
	other, c := s.other(t, &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "idemsvc").TLS(t)}, MinVersion: tls.VersionTLS12}, nil)
	if !strings.HasPrefix(other.url, "https://") {
		t.Fatalf("served at %s", other.url)
	}
	complete(t, c, "over-tls", []byte(`{"paid":true}`), false)
	tb := other.newTab(t)
	// The browser does not know the test CA.
	tb.run(security.SetIgnoreCertificateErrors(true))
	t.Cleanup(func() { _ = chromedp.Run(s.browser, security.SetIgnoreCertificateErrors(false)) })
	tb.signIn(tenantA)
	tb.run(chromedp.Navigate(other.url+"/console/#/keys?tenant="+tenantA+"&state=completed"), chromedp.WaitVisible("#keys", chromedp.ByID))
	tb.listed("over-tls")
	tb.run(chromedp.Navigate(other.url+"/console/#/record?tenant="+tenantA+"&key=over-tls"), chromedp.WaitVisible("#response", chromedp.ByID))
	tb.recordFields("over-tls")
	tb.until(`document.getElementById('body').textContent.includes('"paid": true')`)
	var proto string
	tb.eval(`location.protocol`, &proto)
	if proto != "https:" {
		t.Errorf("the page was served over %s", proto)
	}
	tb.requireOnlyOwnOrigin()
}

// The key a tab signed in with appears in no server log line, no message
// of the page, and no URL the page asked for.
func TestConsoleKeyNeverLogged(t *testing.T) {
	s := getSite(t)
	tb := s.newTab(t)
	tb.signIn(tenantA)
	tb.listed(s.old[tenantA], s.fresh[tenantA])
	tb.run(chromedp.Navigate(s.url+"/console/#/record?tenant="+tenantA+"&key="+s.completed[tenantA]), chromedp.WaitVisible("#response", chromedp.ByID))
	tb.recordFields(s.completed[tenantA])
	tb.run(chromedp.Navigate(s.url+"/console/#/tenants"), chromedp.WaitVisible("#tenants", chromedp.ByID))
	tb.until(`document.querySelectorAll('#tenant-rows tr').length > 0`)
	// A refused call logs its line too.
	tb.run(chromedp.Navigate(s.url + "/console/#/keys?tenant=" + tenantB))
	tb.run(chromedp.WaitVisible("#error", chromedp.ByID))
	// Every request's line is in the log.
	if logs := s.logs.String(); !strings.Contains(logs, `"route":"/v1/usage"`) || !strings.Contains(logs, `"status":403`) {
		t.Fatalf("the server's log lacks the console's requests:\n%.2000s", logs)
	}
	key := s.keys[tenantA]
	if strings.Contains(s.logs.String(), key) {
		t.Error("the server's log holds the API key")
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for _, m := range tb.console {
		if strings.Contains(m, key) {
			t.Errorf("the page logged the API key: %q", m)
		}
	}
	for _, u := range tb.requests {
		if strings.Contains(u, key) {
			t.Errorf("the page asked for a URL with the API key: %s", u)
		}
	}
}

// The console is usable by keyboard alone: the filters, a record opened
// from the list, and its key's confirmation, which opens on Cancel and
// closes on Escape without freeing the key.
func TestConsoleKeyboard(t *testing.T) {
	s := getSite(t)
	tb := s.newTab(t)
	tb.signIn(tenantB) // types the key and presses Enter
	tb.listed(s.old[tenantB], s.fresh[tenantB])

	tb.tabTo(`document.activeElement.id === 'f-state'`)
	// A select takes the first option of the letter typed.
	tb.run(chromedp.KeyEvent("c"))
	tb.tabTo(`document.activeElement.id === 'f-older'`)
	tb.run(chromedp.KeyEvent("0" + kb.Enter))
	tb.until(`location.hash.includes('state=completed')`)
	tb.listed(s.completed[tenantB])

	tb.tabTo(`document.activeElement.textContent === ` + strconv.Quote(s.completed[tenantB]))
	tb.run(chromedp.KeyEvent(kb.Enter))
	tb.run(chromedp.WaitVisible("#record", chromedp.ByID))
	tb.recordFields(s.completed[tenantB])

	tb.tabTo(`document.activeElement.id === 'free'`)
	tb.run(chromedp.KeyEvent(kb.Enter))
	tb.until(`document.getElementById('confirm').open`)
	var focused string
	tb.eval(`document.activeElement.id`, &focused)
	if focused != "confirm-cancel" {
		t.Errorf("the confirmation opened with %q focused, want its Cancel", focused)
	}
	tb.run(chromedp.KeyEvent(kb.Escape))
	tb.until(`!document.getElementById('confirm').open`)
	c, err := idem.New(s.url, idem.WithAPIKey(s.keys[tenantB]))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Status(context.Background(), s.completed[tenantB], false); err != nil {
		t.Errorf("the key after Escape: %v, want it kept", err)
	}
	// Back to the list by its link.
	tb.tabTo(`document.activeElement.id === 'back'`)
	tb.run(chromedp.KeyEvent(kb.Enter))
	tb.run(chromedp.WaitVisible("#keys", chromedp.ByID))
}

// tabTo presses Tab until expr holds in the page, and fails when 60
// presses do not get there.
func (tb *tab) tabTo(expr string) {
	tb.t.Helper()
	for range 60 {
		var ok bool
		tb.eval("Boolean("+expr+")", &ok)
		if ok {
			return
		}
		tb.run(chromedp.KeyEvent(kb.Tab))
	}
	var at string
	tb.eval(`document.activeElement.outerHTML.slice(0, 200)`, &at)
	tb.t.Fatalf("60 presses of Tab never reached %s; focus is on %s", expr, at)
}

// Every control of every page has an accessible name, as the browser
// computes it: from its label, its text or its aria-label.
func TestConsoleLabelled(t *testing.T) {
	s := getSite(t)
	tb := s.newTab(t)
	check := func(page string) {
		t.Helper()
		var nodes []*accessibility.Node
		tb.run(chromedp.ActionFunc(func(ctx context.Context) error {
			var err error
			nodes, err = accessibility.GetFullAXTree().Do(ctx)
			return err
		}))
		str := func(v *accessibility.Value) string {
			var out string
			if v != nil {
				_ = json.Unmarshal(v.Value, &out)
			}
			return out
		}
		controls := map[string]int{}
		for _, n := range nodes {
			role := str(n.Role)
			switch role {
			case "textbox", "spinbutton", "combobox", "button", "checkbox", "link", "meter", "dialog":
			default:
				continue
			}
			if n.Ignored {
				continue
			}
			controls[role]++
			if strings.TrimSpace(str(n.Name)) == "" {
				t.Errorf("%s: a %s has no accessible name (backend node %d)", page, role, n.BackendDOMNodeID)
			}
		}
		t.Logf("%s: controls by role %v", page, controls)
		if len(controls) == 0 {
			t.Errorf("%s: no control found", page)
		}
	}
	tb.run(chromedp.Navigate(s.url+"/console/"), chromedp.WaitVisible("#apikey", chromedp.ByID))
	check("sign-in")
	tb.signIn(admin)
	tb.run(chromedp.Navigate(s.url + "/console/#/keys?tenant=" + tenantA))
	tb.listed(s.old[tenantA], s.fresh[tenantA])
	check("keys")
	tb.run(chromedp.Navigate(s.url+"/console/#/record?tenant="+tenantA+"&key="+s.completed[tenantA]), chromedp.WaitVisible("#response", chromedp.ByID))
	tb.recordFields(s.completed[tenantA])
	check("record")
	tb.run(chromedp.Evaluate(`document.getElementById('free').click()`, nil))
	tb.until(`document.getElementById('confirm').open`)
	check("confirmation")
	tb.run(chromedp.KeyEvent(kb.Escape))
	tb.until(`!document.getElementById('confirm').open`)
	tb.run(chromedp.Navigate(s.url+"/console/#/tenants"), chromedp.WaitVisible("#tenants", chromedp.ByID))
	tb.until(`document.querySelectorAll('#tenant-rows meter').length > 0`)
	check("tenants")
}

// The keys are paged with the listing's cursor (Next page, First page),
// and with "Refresh every 5 s" a key begun since shows up without a click.
func TestConsolePagesAndAutoRefresh(t *testing.T) {
	s := getSite(t)
	other, c := s.other(t, nil, nil)
	ctx := context.Background()
	for i := range 150 {
		if _, err := c.Begin(ctx, idem.BeginParams{Key: fmt.Sprintf("page/%03d", i), Lease: 10 * time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	tb := other.newTab(t)
	tb.signIn(tenantA)
	keys := func() []string {
		var got []string
		tb.eval(`Array.from(document.querySelectorAll('#key-rows td.key')).map(e => e.textContent)`, &got)
		return got
	}
	tb.until(`document.querySelectorAll('#key-rows tr').length === 100`)
	first := keys()
	var disabled bool
	tb.eval(`document.getElementById('next-page').disabled`, &disabled)
	if disabled {
		t.Fatal("Next page is disabled with 150 keys listed 100 a page")
	}
	tb.run(chromedp.Click("#next-page", chromedp.ByID))
	tb.until(`document.querySelectorAll('#key-rows tr').length === 50`)
	second := keys()
	all := append(slices.Clone(first), second...)
	slices.Sort(all)
	if len(slices.Compact(all)) != 150 {
		t.Errorf("the two pages hold %d distinct keys, want 150", len(slices.Compact(all)))
	}
	tb.eval(`document.getElementById('next-page').disabled`, &disabled)
	if !disabled {
		t.Error("Next page is enabled on the last page")
	}
	tb.run(chromedp.Click("#first-page", chromedp.ByID))
	tb.until(`document.querySelectorAll('#key-rows tr').length === 100`)
	if got := keys(); !slices.Equal(got, first) {
		t.Errorf("First page shows %d keys, not the first page's", len(got))
	}

	// Automatic refresh: on the completed keys, none yet.
	tb.run(chromedp.Navigate(other.url + "/console/#/keys?tenant=" + tenantA + "&state=completed"))
	tb.until(`document.getElementById('key-caption').textContent.startsWith('0 completed')`)
	tb.run(chromedp.Click("#auto", chromedp.ByID))
	complete(t, c, "refreshed", []byte("done"), false)
	start := time.Now()
	tb.listed("refreshed")
	t.Logf("a completed key listed %v after it completed, with no click", time.Since(start).Round(time.Millisecond))
}
