// SPDX-License-Identifier: Apache-2.0

package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/performance"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/console"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/quota"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/logbuf"
)

// chromium is Debian's Chromium, which scripts/test.sh installs.
const chromium = "/usr/bin/chromium"

// The environment variables of the tests: where to write screenshots of
// the pages when a test fails (default: a folder under os.TempDir), and
// where to write the screenshots of docs/ (none unless set).
const (
	artifactsVar   = "IDEMSVC_TEST_CONSOLE_ARTIFACTS"
	screenshotsVar = "IDEMSVC_TEST_CONSOLE_SCREENSHOTS"
)

// site is an idemsvc on the memory store with the console, two tenants,
// a third for the long listing, and an admin, with their records.
type site struct {
	url  string
	keys map[string]string // tenant -> API key
	// The records seeded, by tenant: stuck in progress since before the
	// others, in progress recently, completed, failed.
	old, fresh, completed, failed map[string]string
	script                        string // tenant a's key whose stored body holds markup
	// tenant a's failed key whose owner, fingerprint, error and JSON body
	// hold markup.
	scriptFailed string
	// tenantFree's key in progress since oldAt, never freed.
	oldFree string
	oldAt   time.Time
	browser context.Context
	logs    *logbuf.Buffer // the server's log
}

const (
	tenantA, tenantB, tenantBulk, admin = "acme", "globex", "bulk", "ops"
	// tenantFree is the tenant of TestConsoleFilterRecordFree alone, whose
	// keys no other test lists.
	tenantFree = "initech"
	// ageGap is the age filter of TestConsoleFilterRecordFree: its old key
	// is older, and the key it begins stays younger, by seconds of margin.
	ageGap   = 10
	bulkKeys = 1000
	// markup is a stored body that would run script if it were rendered
	// as HTML.
	markup = `<script>window.__ran = 1</script><img src=x onerror="window.__ran = 2"><b>bold</b>`
	// markupShort is markup that fits an owner or a fingerprint.
	markupShort = `<img src=x onerror="window.__ran = 4"><b>b</b>`
)

var (
	siteOnce sync.Once
	theSite  *site
	siteErr  error
)

// The site is shared by the tests of the package: one server, one browser.
func getSite(t *testing.T) *site {
	t.Helper()
	siteOnce.Do(func() { theSite, siteErr = newSite() })
	if siteErr != nil {
		t.Fatal(siteErr)
	}
	return theSite
}

func TestMain(m *testing.M) {
	code := m.Run()
	if theSite != nil {
		theSite.close()
	}
	os.Exit(code)
}

var closers []func()

func (s *site) close() {
	for i := len(closers) - 1; i >= 0; i-- {
		closers[i]()
	}
}

func newSite() (*site, error) {
	if _, err := os.Stat(chromium); err != nil {
		return nil, fmt.Errorf("the console's tests need Debian's Chromium at %s (scripts/test.sh installs it: apt-get install chromium): %w", chromium, err)
	}
	s := &site{keys: map[string]string{}, old: map[string]string{}, fresh: map[string]string{},
		completed: map[string]string{}, failed: map[string]string{}, logs: &logbuf.Buffer{}}
	var yaml strings.Builder
	yaml.WriteString("tenants:\n")
	for _, name := range []string{tenantA, tenantB, tenantBulk, tenantFree, admin} {
		s.keys[name] = "sk-console-" + name
		fmt.Fprintf(&yaml, "  - name: %s\n    api_key_sha256: [%q]\n", name, auth.Digest(s.keys[name]))
		switch name {
		case admin:
			yaml.WriteString("    admin: true\n")
		case tenantA:
			yaml.WriteString("    limits: {begins_per_s: 100, burst: 200, stored_bytes: 1000000, waiters: 10, in_progress: 2000}\n")
		}
	}
	keyring, err := auth.Parse([]byte(yaml.String()))
	if err != nil {
		return nil, err
	}
	tb := &cleanupTB{}
	closers = append(closers, tb.run)
	// A limiter, so that the Tenants page has figures to show.
	limiter := quota.NewMemory(quota.Options{})
	closers = append(closers, limiter.Close)
	srv := idemtest.Serve(tb, handlers.Config{Keyring: keyring, Limiter: limiter,
		Logger: slog.New(slog.NewJSONHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}, console.Handler)
	s.url = srv.URL

	ctx := context.Background()
	client := func(tenant string) *idem.Client {
		c, err := idem.New(s.url, idem.WithAPIKey(s.keys[tenant]))
		if err != nil {
			panic(err)
		}
		return c
	}
	begin := func(c *idem.Client, key string) (*idem.BeginAcquired, error) {
		r, err := c.Begin(ctx, idem.BeginParams{Key: key, Owner: "worker-" + key, Fingerprint: "sha256:" + key, Lease: 10 * time.Minute})
		if err != nil {
			return nil, err
		}
		if r.Lease == nil {
			return nil, fmt.Errorf("%s: not acquired", key)
		}
		return r.Lease, nil
	}
	s.oldAt = time.Now()
	s.oldFree = tenantFree + "/order-1/charge"
	if _, err := begin(client(tenantFree), s.oldFree); err != nil {
		return nil, err
	}
	for _, tenant := range []string{tenantA, tenantB} {
		c := client(tenant)
		s.old[tenant] = tenant + "/order-1/charge"
		if _, err := begin(c, s.old[tenant]); err != nil {
			return nil, err
		}
		s.completed[tenant] = tenant + "/order-2/charge"
		l, err := begin(c, s.completed[tenant])
		if err != nil {
			return nil, err
		}
		if _, err := c.Complete(ctx, l.Key, l.LeaseToken, idem.Response{StatusCode: 201,
			Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(`{"charge_id":"ch_1","amount":4200}`)}, 0); err != nil {
			return nil, err
		}
		s.failed[tenant] = tenant + "/order-3/charge"
		if l, err = begin(c, s.failed[tenant]); err != nil {
			return nil, err
		}
		if _, err := c.Fail(ctx, l.Key, l.LeaseToken, idem.FailParams{Terminal: true, Error: "card declined",
			Response: idem.Response{StatusCode: 402, Body: []byte("declined")}}); err != nil {
			return nil, err
		}
	}
	s.script = tenantA + "/markup"
	c := client(tenantA)
	l, err := begin(c, s.script)
	if err != nil {
		return nil, err
	}
	if _, err := c.Complete(ctx, l.Key, l.LeaseToken, idem.Response{StatusCode: 200,
		Headers: map[string]string{"Content-Type": "text/html", "X-Note": `<img src=x onerror="window.__ran = 3">`}, Body: []byte(markup)}, 0); err != nil {
		return nil, err
	}
	s.scriptFailed = tenantA + "/markup-failed"
	r, err := c.Begin(ctx, idem.BeginParams{Key: s.scriptFailed, Owner: markupShort, Fingerprint: markupShort, Lease: 10 * time.Minute})
	if err != nil || r.Lease == nil {
		return nil, fmt.Errorf("begin %s: %v", s.scriptFailed, err)
	}
	if _, err := c.Fail(ctx, r.Lease.Key, r.Lease.LeaseToken, idem.FailParams{Terminal: true, Error: markupShort,
		Response: idem.Response{StatusCode: 500, Headers: map[string]string{"Content-Type": "application/json"},
			Body: []byte(`{"html":` + strconv.Quote(markupShort) + `}`)}}); err != nil {
		return nil, err
	}
	bulk := client(tenantBulk)
	for i := range bulkKeys {
		if _, err := begin(bulk, fmt.Sprintf("bulk/%04d", i)); err != nil {
			return nil, err
		}
	}
	// The old keys are 2 s old before the fresh ones begin.
	time.Sleep(2100 * time.Millisecond)
	for _, tenant := range []string{tenantA, tenantB} {
		s.fresh[tenant] = tenant + "/order-4/charge"
		if _, err := begin(client(tenant), s.fresh[tenant]); err != nil {
			return nil, err
		}
	}

	dir, err := os.MkdirTemp("", "idemsvc-console-chromium-")
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = os.RemoveAll(dir) })
	// chromedp's defaults keep a headless Chromium steady on a busy
	// machine (no /dev/shm, no throttled timers or backgrounded pages).
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox, // as root
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(dir), // fresh for each run
		chromedp.WindowSize(1280, 900),
	)...)
	closers = append(closers, cancelAlloc)
	// chromedp logs the events of newer protocol versions it does not
	// know (e.g. a dialog's top layer) as errors; they are not.
	browser, cancelBrowser := chromedp.NewContext(alloc, chromedp.WithErrorf(func(format string, args ...any) {
		if !strings.HasPrefix(format, "unhandled") {
			log.Printf(format, args...)
		}
	}))
	closers = append(closers, cancelBrowser)
	if err := chromedp.Run(browser); err != nil { // starts the browser
		return nil, fmt.Errorf("start %s: %w", chromium, err)
	}
	s.browser = browser
	return s, nil
}

// cleanupTB is the testing.TB of the shared server, whose cleanups run
// when the package's tests are over.
type cleanupTB struct {
	testing.TB
	cleanups []func()
}

func (c *cleanupTB) Helper()               {}
func (c *cleanupTB) Cleanup(f func())      { c.cleanups = append(c.cleanups, f) }
func (c *cleanupTB) Fatalf(string, ...any) { panic("console test server failed to start") }
func (c *cleanupTB) run() {
	for i := len(c.cleanups) - 1; i >= 0; i-- {
		c.cleanups[i]()
	}
}

// tab is one browser tab of a test, with its own session storage.
type tab struct {
	t        *testing.T
	s        *site
	ctx      context.Context
	mu       sync.Mutex
	requests []string // every URL the page asked for
	console  []string // every message the page logged (console.*, uncaught errors, the browser's log)
}

// newTab opens a tab; when the test fails, it saves a screenshot of each
// page of the console to the artifacts folder.
func (s *site) newTab(t *testing.T) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(s.browser)
	tb := &tab{t: t, s: s, ctx: ctx}
	// Open the tab, for as long as ctx lasts, in front and focused: a
	// background page defers some of its tasks (a dialog's close event).
	if err := chromedp.Run(ctx, page.BringToFront(), emulation.SetFocusEmulationEnabled(true)); err != nil {
		t.Fatal(err)
	}
	chromedp.ListenTarget(ctx, func(ev any) {
		tb.mu.Lock()
		defer tb.mu.Unlock()
		switch e := ev.(type) {
		case *network.EventRequestWillBeSent:
			tb.requests = append(tb.requests, e.Request.URL)
		case *runtime.EventConsoleAPICalled:
			for _, arg := range e.Args {
				tb.console = append(tb.console, string(arg.Value)+arg.Description)
			}
		case *runtime.EventExceptionThrown:
			tb.console = append(tb.console, e.ExceptionDetails.Error())
		case *cdplog.EventEntryAdded:
			tb.console = append(tb.console, e.Entry.Text+" "+e.Entry.URL)
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			tb.artifacts()
		}
		cancel()
	})
	return tb
}

func (tb *tab) run(actions ...chromedp.Action) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Run(ctx, actions...); err != nil {
		tb.t.Fatalf("browser: %v", err)
	}
}

// artifacts saves a screenshot of the page as it is, then of each page.
func (tb *tab) artifacts() {
	dir := os.Getenv(artifactsVar)
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "idemsvc-console-artifacts")
	}
	dir = filepath.Join(dir, strings.ReplaceAll(tb.t.Name(), "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.t.Logf("artifacts: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(tb.ctx, 20*time.Second)
	defer cancel()
	shot := func(name string) {
		var png []byte
		if err := chromedp.Run(ctx, page.BringToFront(), chromedp.FullScreenshot(&png, 100)); err != nil {
			tb.t.Logf("screenshot %s: %v", name, err)
			return
		}
		path := filepath.Join(dir, name+".png")
		if err := os.WriteFile(path, png, 0o644); err == nil {
			tb.t.Logf("screenshot of the page: %s", path)
		}
	}
	shot("failed")
	for _, page := range []string{"keys", "tenants"} {
		if err := chromedp.Run(ctx, chromedp.Navigate(tb.s.url+"/console/#/"+page), chromedp.Sleep(500*time.Millisecond)); err == nil {
			shot(page)
		}
	}
}

// readme saves a screenshot of the page for docs/ when asked to.
func (tb *tab) readme(name string) {
	dir := os.Getenv(screenshotsVar)
	if dir == "" {
		return
	}
	var png []byte
	tb.run(page.BringToFront(), chromedp.FullScreenshot(&png, 100))
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		tb.t.Fatal(err)
	}
	tb.t.Logf("screenshot: %s", path)
}

// signIn signs in as tenant, by keyboard: the key typed, Enter.
func (tb *tab) signIn(tenant string) {
	tb.t.Helper()
	tb.run(
		chromedp.Navigate(tb.s.url+"/console/"),
		chromedp.WaitVisible("#apikey", chromedp.ByID),
		chromedp.SendKeys("#apikey", tb.s.keys[tenant]+kb.Enter, chromedp.ByID),
		chromedp.WaitVisible("#keys", chromedp.ByID),
	)
}

// listed waits until the keys shown are want (sorted), and fails if they
// do not become it.
func (tb *tab) listed(want ...string) {
	tb.t.Helper()
	slices.Sort(want)
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		tb.run(chromedp.Evaluate(`Array.from(document.querySelectorAll('#key-rows td.key')).map(e => e.textContent).sort()`, &got))
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			tb.t.Fatalf("keys listed %q, want %q", got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// until waits until expr is true in the page, and fails if it does not
// become true.
func (tb *tab) until(expr string) {
	tb.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var ok bool
		tb.run(chromedp.Evaluate("Boolean("+expr+")", &ok))
		if ok {
			return
		}
		if time.Now().After(deadline) {
			tb.t.Fatalf("the page never had %s", expr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (tb *tab) text(sel string) string {
	tb.t.Helper()
	var s string
	tb.run(chromedp.Text(sel, &s, chromedp.ByQuery))
	return s
}

func (tb *tab) eval(expr string, out any) {
	tb.t.Helper()
	tb.run(chromedp.Evaluate(expr, out))
}

// requireOnlyOwnOrigin fails if the page asked anything of another origin.
func (tb *tab) requireOnlyOwnOrigin() {
	tb.t.Helper()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for _, u := range tb.requests {
		if !strings.HasPrefix(u, tb.s.url+"/") && !strings.HasPrefix(u, "blob:"+tb.s.url) {
			tb.t.Errorf("the page requested %s, outside %s", u, tb.s.url)
		}
	}
}

// Each key sees what it may: a tenant its own keys and no other tenant's,
// an admin every tenant.
func TestConsoleAccess(t *testing.T) {
	s := getSite(t)
	for _, tenant := range []string{tenantA, tenantB} {
		t.Run(tenant, func(t *testing.T) {
			tb := s.newTab(t)
			tb.signIn(tenant)
			tb.listed(s.old[tenant], s.fresh[tenant])
			if who := tb.text("#who"); who != "tenant "+tenant {
				t.Errorf("signed in as %q, want tenant %s", who, tenant)
			}
			var options []string
			tb.eval(`Array.from(document.querySelectorAll('#f-tenant option')).map(o => o.value)`, &options)
			if !slices.Equal(options, []string{tenant}) {
				t.Errorf("tenants offered %q, want only %s", options, tenant)
			}
			// Another tenant's keys, through a link: refused, nothing listed.
			other := tenantB
			if tenant == tenantB {
				other = tenantA
			}
			tb.run(chromedp.Navigate(s.url + "/console/#/keys?tenant=" + other + "&state=completed"))
			tb.run(chromedp.WaitVisible("#error", chromedp.ByID))
			if msg := tb.text("#error"); !strings.Contains(strings.ToLower(msg), "forbidden") {
				t.Errorf("error shown %q, want forbidden", msg)
			}
			var rows int
			tb.eval(`document.querySelectorAll('#key-rows tr').length`, &rows)
			if rows != 0 {
				t.Errorf("%d rows of another tenant shown", rows)
			}
			tb.run(chromedp.Navigate(s.url+"/console/#/tenants"), chromedp.WaitVisible("#tenants", chromedp.ByID))
			tb.until(`document.querySelectorAll('#tenant-rows tr').length > 0`)
			var shown []string
			tb.eval(`Array.from(document.querySelectorAll('#tenant-rows tr td:first-child')).map(e => e.textContent)`, &shown)
			if !slices.Equal(shown, []string{tenant}) {
				t.Errorf("tenants page shows %q, want only %s", shown, tenant)
			}
			var key string
			tb.eval(`sessionStorage.getItem('idemsvc.apiKey')`, &key)
			if key != s.keys[tenant] {
				t.Errorf("session storage holds %q", key)
			}
			var href string
			tb.eval(`location.href`, &href)
			if strings.Contains(href, s.keys[tenant]) {
				t.Errorf("the key is in the URL %s", href)
			}
			tb.requireOnlyOwnOrigin()
		})
	}
	t.Run("admin", func(t *testing.T) {
		tb := s.newTab(t)
		tb.signIn(admin)
		var options []string
		tb.eval(`Array.from(document.querySelectorAll('#f-tenant option')).map(o => o.value)`, &options)
		if want := []string{tenantA, tenantB, tenantBulk, tenantFree, admin}; !slices.Equal(slices.Sorted(slices.Values(options)), slices.Sorted(slices.Values(want))) {
			t.Errorf("tenants offered %q, want %q", options, want)
		}
		for _, tenant := range []string{tenantA, tenantB} {
			tb.run(chromedp.Navigate(s.url + "/console/#/keys?tenant=" + tenant + "&state=completed"))
			want := []string{s.completed[tenant]}
			if tenant == tenantA {
				want = append(want, s.script)
			}
			tb.listed(want...)
		}
		tb.run(chromedp.Navigate(s.url+"/console/#/tenants"), chromedp.WaitVisible("#tenants", chromedp.ByID))
		tb.until(`document.querySelectorAll('#tenant-rows tr').length > 0`)
		var shown []string
		tb.eval(`Array.from(document.querySelectorAll('#tenant-rows tr td:first-child')).map(e => e.textContent)`, &shown)
		if len(shown) != 5 {
			t.Errorf("tenants page shows %q, want 5 tenants", shown)
		}
		// A figure from the limiter: the stored bytes of acme's bodies
		// (flushed within a second), against its limit.
		stored := `Array.from(document.querySelectorAll('#tenant-rows tr')).find(tr => tr.cells[0].textContent === '` + tenantA + `').cells[2].textContent`
		deadline := time.Now().Add(10 * time.Second)
		for {
			var cell string
			tb.eval(stored, &cell)
			if strings.HasSuffix(cell, " / 1000000") && !strings.HasPrefix(cell, "0 ") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("acme's stored bytes shown %q, want its bodies' bytes / 1000000", cell)
			}
			tb.run(chromedp.Click("#tenants-refresh", chromedp.ByID), chromedp.Sleep(200*time.Millisecond))
		}
		tb.readme("console-tenants.png")
		tb.requireOnlyOwnOrigin()
	})
	t.Run("signed out", func(t *testing.T) {
		tb := s.newTab(t)
		tb.signIn(tenantA)
		tb.run(chromedp.Click("#signout", chromedp.ByID), chromedp.WaitVisible("#signin", chromedp.ByID))
		var key any
		tb.eval(`sessionStorage.getItem('idemsvc.apiKey')`, &key)
		if key != nil {
			t.Errorf("after sign out the session holds %v", key)
		}
	})
}

// Signing in from a shared link shows what the link names, its filters
// kept: #/keys (whose hash signing in does not change) and a filtered
// listing.
func TestConsoleSignInFromLink(t *testing.T) {
	s := getSite(t)
	for _, c := range []struct {
		link string
		want []string
	}{
		{"#/keys", []string{s.old[tenantB], s.fresh[tenantB]}},
		{"#/keys?tenant=" + tenantB + "&state=completed", []string{s.completed[tenantB]}},
	} {
		t.Run(c.link, func(t *testing.T) {
			tb := s.newTab(t)
			tb.run(
				chromedp.Navigate(s.url+"/console/"+c.link),
				chromedp.WaitVisible("#apikey", chromedp.ByID),
				chromedp.SendKeys("#apikey", s.keys[tenantB]+kb.Enter, chromedp.ByID),
				chromedp.WaitVisible("#keys", chromedp.ByID),
			)
			tb.listed(c.want...)
			var hash string
			tb.eval(`location.hash`, &hash)
			if hash != c.link {
				t.Errorf("the link became %s, want %s", hash, c.link)
			}
		})
	}
}

// Filter by age, open a record, free a key: the API no longer has it.
// The test has a tenant of its own and frees only the key it begins, so
// it can run again (-count) and leaves the other tests' records alone.
func TestConsoleFilterRecordFree(t *testing.T) {
	s := getSite(t)
	tb := s.newTab(t)
	tb.signIn(tenantFree)
	c, err := idem.New(s.url, idem.WithAPIKey(s.keys[tenantFree]))
	if err != nil {
		t.Fatal(err)
	}
	// The old key is older than the filter by a second, and the key begun
	// now stays younger than it for ageGap-1 s: margins a busy machine keeps.
	time.Sleep(time.Until(s.oldAt.Add((ageGap + 1) * time.Second)))
	now := fmt.Sprintf("%s/order-%d/charge", tenantFree, time.Now().UnixNano())
	begun := time.Now()
	if _, err := c.Begin(context.Background(), idem.BeginParams{Key: now, Owner: "worker-" + now, Fingerprint: "sha256:" + now, Lease: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	tb.run(chromedp.Click("#refresh", chromedp.ByID))
	tb.listed(s.oldFree, now)
	tb.run(
		chromedp.SetValue("#f-older", strconv.Itoa(ageGap), chromedp.ByID),
		chromedp.Click(`#filters button[type="submit"]`, chromedp.ByQuery),
	)
	tb.listed(s.oldFree) // not the key begun now
	if since := time.Since(begun); since >= ageGap*time.Second {
		t.Fatalf("the machine is too slow for the test: %v between the begin and the filtered listing", since)
	}
	var hash string
	tb.eval(`location.hash`, &hash)
	if !strings.Contains(hash, "older_than_s="+strconv.Itoa(ageGap)) || !strings.Contains(hash, "state=in_progress") {
		t.Errorf("the filters are not in the URL: %s", hash)
	}
	tb.readme("console.png")

	tb.run(chromedp.Evaluate(`Array.from(document.querySelectorAll('#key-rows a')).find(a => a.textContent === `+strconv.Quote(s.oldFree)+`).click()`, nil),
		chromedp.WaitVisible("#record", chromedp.ByID))
	fields := tb.recordFields(s.oldFree)
	for name, want := range map[string]string{"Key": s.oldFree, "Tenant": tenantFree, "State": "in_progress", "Attempt": "1",
		"Owner": "worker-" + s.oldFree, "Fingerprint": "sha256:" + s.oldFree} {
		if fields[name] != want {
			t.Errorf("record %s = %q, want %q", name, fields[name], want)
		}
	}
	for _, name := range []string{"Lease until", "Created", "Updated", "Retained until"} {
		if fields[name] == "" {
			t.Errorf("record has no %s: %v", name, fields)
		}
	}
	tb.readme("console-record.png")

	// Free the key begun now, from its record.
	tb.run(chromedp.Navigate(s.url+"/console/#/record?tenant="+tenantFree+"&key="+url.QueryEscape(now)), chromedp.WaitVisible("#record", chromedp.ByID))
	tb.recordFields(now)
	// The dialog is driven by script and polled: chromedp's node tracking
	// does not follow the top layer a modal dialog opens.
	tb.run(chromedp.Evaluate(`document.getElementById('free').click()`, nil))
	tb.until(`document.getElementById('confirm').open`)
	if msg := tb.text("#confirm-text"); !strings.Contains(msg, now) || !strings.Contains(msg, tenantFree) {
		t.Errorf("confirmation %q does not name the key and the tenant", msg)
	}
	tb.run(chromedp.Evaluate(`document.getElementById('confirm-free').click()`, nil))
	tb.until(`!document.getElementById('notice').hidden`)
	if _, err := c.Status(context.Background(), now, false); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("status of the freed key: %v, want not found", err)
	}
	// The log records who freed it.
	freed := false
	for _, line := range strings.Split(s.logs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["method"] == http.MethodDelete && m["route"] == "/v1/keys" &&
			m["status"] == float64(http.StatusNoContent) && m["outcome"] == "deleted" && m["tenant"] == tenantFree {
			freed = true
		}
	}
	if !freed {
		t.Errorf("no log line of the free by %s:\n%.3000s", tenantFree, s.logs.String())
	}
	// The other key is untouched.
	if _, err := c.Status(context.Background(), s.oldFree, false); err != nil {
		t.Errorf("the key not freed: %v", err)
	}
	tb.requireOnlyOwnOrigin()
}

// recordFields waits until the record shown is key's, and returns its
// fields by name.
func (tb *tab) recordFields(key string) map[string]string {
	tb.t.Helper()
	var fields map[string]string
	deadline := time.Now().Add(10 * time.Second)
	for {
		tb.eval(`Object.fromEntries(Array.from(document.querySelectorAll('#record-fields dt')).map(dt => [dt.textContent, dt.nextElementSibling.textContent]))`, &fields)
		if fields["Key"] == key {
			return fields
		}
		if time.Now().After(deadline) {
			tb.t.Fatalf("record shown %v, want %s's", fields, key)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A stored body and header holding markup show as text; no script runs.
func TestConsoleStoredBodyIsText(t *testing.T) {
	s := getSite(t)
	tb := s.newTab(t)
	tb.signIn(tenantA)
	tb.run(chromedp.Navigate(s.url+"/console/#/record?tenant="+tenantA+"&key="+s.script), chromedp.WaitVisible("#response", chromedp.ByID))
	var body string
	deadline := time.Now().Add(10 * time.Second)
	for body != markup && time.Now().Before(deadline) {
		tb.eval(`document.getElementById('body').textContent`, &body)
		time.Sleep(100 * time.Millisecond)
	}
	if body != markup {
		t.Errorf("body shown %q, want the markup as text %q", body, markup)
	}
	var header string
	tb.eval(`Array.from(document.querySelectorAll('#header-rows td')).map(e => e.textContent).join('|')`, &header)
	if !strings.Contains(header, `<img src=x onerror="window.__ran = 3">`) {
		t.Errorf("header shown %q", header)
	}
	time.Sleep(300 * time.Millisecond) // an image's error would have fired
	var ran any
	var imgs, scripts, bolds int
	tb.eval(`window.__ran === undefined ? null : window.__ran`, &ran)
	tb.eval(`document.querySelectorAll('img').length`, &imgs)
	tb.eval(`document.querySelectorAll('main script').length`, &scripts)
	tb.eval(`document.querySelectorAll('b').length`, &bolds)
	if ran != nil || imgs != 0 || scripts != 0 || bolds != 0 {
		t.Errorf("markup was rendered: ran %v, %d img, %d script, %d b elements", ran, imgs, scripts, bolds)
	}
	// Markup in the owner, the fingerprint, the error and a JSON body
	// (its pretty view) is text too.
	tb.run(chromedp.Navigate(s.url+"/console/#/record?tenant="+tenantA+"&key="+s.scriptFailed), chromedp.WaitVisible("#record", chromedp.ByID))
	fields := tb.recordFields(s.scriptFailed)
	for _, name := range []string{"Owner", "Fingerprint", "Error"} {
		if fields[name] != markupShort {
			t.Errorf("record %s shown %q, want the markup as text %q", name, fields[name], markupShort)
		}
	}
	tb.until(`document.getElementById('body-view').value === 'json'`)
	if body := tb.text("#body"); !strings.Contains(body, markupShort[:10]) || !strings.Contains(body, "\n  \"html\"") && !strings.Contains(body, "\"html\":") {
		t.Errorf("JSON view %q, want the markup as text", body)
	}
	time.Sleep(300 * time.Millisecond)
	// The real assertion: no element was made from the markup.
	tb.eval(`document.querySelectorAll('img').length`, &imgs)
	tb.eval(`document.querySelectorAll('b').length`, &bolds)
	if imgs != 0 || bolds != 0 {
		t.Errorf("markup was rendered: %d img, %d b elements", imgs, bolds)
	}
	tb.run(chromedp.Navigate(s.url+"/console/#/record?tenant="+tenantA+"&key="+s.script), chromedp.WaitVisible("#response", chromedp.ByID))
	tb.until(`document.getElementById('body').textContent === ` + strconv.Quote(markup))

	// The hex view and the download.
	tb.run(chromedp.SetValue("#body-view", "hex", chromedp.ByID), chromedp.Evaluate(`document.getElementById('body-view').dispatchEvent(new Event('change'))`, nil))
	if hex := tb.text("#body"); !strings.HasPrefix(hex, "00000000  3c 73 63 72") {
		t.Errorf("hex view %q", hex)
	}
	var href string
	tb.eval(`document.getElementById('download').href`, &href)
	if !strings.HasPrefix(href, "blob:") {
		t.Errorf("download link %q, want a blob: URL", href)
	}
}

// A list of 1,000 keys renders in under 1 s (the console's target). What
// is asserted is the CPU time of the page's main thread, from the change of
// the URL to the rows laid out (the answer's parse, the rows built, their
// layout): on a machine shared with other work the wall time is mostly
// waiting for a core, and is logged beside it, bounded only loosely.
func TestConsoleThousandKeys(t *testing.T) {
	s := getSite(t)
	tb := s.newTab(t)
	tb.signIn(tenantBulk)
	metrics := func() map[string]float64 {
		out := map[string]float64{}
		tb.run(chromedp.ActionFunc(func(ctx context.Context) error {
			ms, err := performance.GetMetrics().Do(ctx)
			for _, m := range ms {
				out[m.Name] = m.Value
			}
			return err
		}))
		return out
	}
	tb.run(performance.Enable().WithTimeDomain(performance.EnableTimeDomainThreadTicks))
	before := metrics()
	var ms float64
	tb.run(chromedp.Evaluate(`new Promise((done) => {
		const t0 = performance.now();
		location.hash = '#/keys?state=in_progress&limit=1000&tenant=bulk';
		const rows = document.getElementById('key-rows');
		const seen = new MutationObserver(() => {
			if (rows.children.length === 1000) {
				seen.disconnect();
				document.getElementById('key-table').getBoundingClientRect(); // laid out
				done(performance.now() - t0);
			}
		});
		seen.observe(rows, { childList: true });
	})`, &ms, func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }))
	after := metrics()
	cpu := (after["ThreadTime"] - before["ThreadTime"]) * 1000
	var render string
	tb.eval(`document.getElementById('key-table').dataset.renderMs`, &render)
	t.Logf("1,000 keys: %.0f ms of the page's CPU (script %.0f ms, layout %.0f ms); %.0f ms of wall time from the URL's change to the rows laid out (fetch included), of which %s ms to build the rows",
		cpu, (after["ScriptDuration"]-before["ScriptDuration"])*1000, (after["LayoutDuration"]-before["LayoutDuration"])*1000, ms, render)
	if cpu <= 0 || cpu >= 1000 {
		t.Errorf("1,000 keys took %.0f ms of the page's CPU, want under 1 s", cpu)
	}
	if ms > 20000 {
		t.Errorf("1,000 keys took %.0f ms end to end, want under 20 s even on a busy machine", ms)
	}
}

// The console weighs under 200 KB, and its headers forbid inline script,
// framing and sniffing.
func TestConsoleWeightAndHeaders(t *testing.T) {
	s := getSite(t)
	var total int64
	err := fs.WalkDir(console.Assets(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		total += info.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("page weight: %d bytes", total)
	if total >= 200_000 {
		t.Errorf("the console weighs %d bytes, want under 200 KB", total)
	}
	for _, path := range []string{"/console/", "/console/console.js", "/console/console.css"} {
		resp, err := http.Get(s.url + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d", path, resp.StatusCode)
		}
		csp := resp.Header.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "base-uri 'none'", "form-action 'self'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("%s: Content-Security-Policy %q lacks %q", path, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
			t.Errorf("%s: Content-Security-Policy %q allows inline script", path, csp)
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("Referrer-Policy") != "no-referrer" {
			t.Errorf("%s: headers %v", path, resp.Header)
		}
		if len(resp.Cookies()) > 0 {
			t.Errorf("%s sets a cookie", path)
		}
	}
	resp, err := http.Post(s.url+"/console/", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /console/: %d, want 405", resp.StatusCode)
	}
}
