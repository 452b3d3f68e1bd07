// SPDX-License-Identifier: Apache-2.0

package polyglot

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/auth"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// script is a way to run one of the scripts.
type script struct {
	name string
	argv []string
}

// scripts are the scripts this machine can run: sh always, node when it
// is installed.
func scripts(t *testing.T) []script {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatalf("begin-complete-replay.sh needs curl: %v", err)
	}
	out := []script{{"sh", []string{"sh", "begin-complete-replay.sh"}}}
	if node, err := exec.LookPath("node"); err == nil {
		out = append(out, script{"node", []string{node, "begin-complete-replay.mjs"}})
	} else {
		t.Log("NOT TESTED: begin-complete-replay.mjs, because node is not installed on this machine (exec.LookPath: " + err.Error() + ")")
	}
	return out
}

// startIdemsvc serves an in-process idemsvc, with keyring (nil: no
// authentication), on a real loopback port until the test ends.
func startIdemsvc(t *testing.T, keyring *auth.Keyring) string {
	t.Helper()
	return idemtest.Serve(t, handlers.Config{Keyring: keyring}).URL
}

// run is one run of a script.
type run struct {
	err            error
	key            string // the key the script printed
	stdout, stderr string
}

// runScript runs s with IDEMSVC_URL=idemURL and, when not empty,
// IDEMSVC_API_KEY=apiKey, in an environment without proxies.
func runScript(t *testing.T, s script, idemURL, apiKey string) run {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.argv[0], s.argv[1:]...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "IDEMSVC_URL=" + idemURL}
	if tmp := os.Getenv("TMPDIR"); tmp != "" {
		cmd.Env = append(cmd.Env, "TMPDIR="+tmp)
	}
	if apiKey != "" {
		cmd.Env = append(cmd.Env, "IDEMSVC_API_KEY="+apiKey)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := run{err: err, stdout: stdout.String(), stderr: stderr.String()}
	for line := range strings.Lines(r.stdout) {
		if k, ok := strings.CutPrefix(line, "key:"); ok {
			r.key = strings.TrimSpace(k)
		}
	}
	return r
}

// wantOK checks that r succeeded and left key completed with the response
// the scripts store, as c sees it.
func (r run) wantOK(t *testing.T, c *idem.Client) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("script failed: %v\nstdout:\n%s\nstderr:\n%s", r.err, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "ok: the replayed begin gave back the completed response") {
		t.Errorf("stdout:\n%s", r.stdout)
	}
	if r.key == "" {
		t.Fatalf("the script printed no key:\n%s", r.stdout)
	}
	rec, err := c.Status(t.Context(), r.key, true)
	if err != nil {
		t.Fatalf("status of %s: %v", r.key, err)
	}
	if rec.State != idem.StateCompleted || rec.Attempt != 1 || rec.Response == nil {
		t.Fatalf("record of %s: %+v", r.key, rec)
	}
	resp, err := rec.Response.Decode()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 201 || resp.Headers["Content-Type"] != "application/json" ||
		!strings.HasPrefix(string(resp.Body), `{"charge_id":"ch_`) || !strings.HasSuffix(string(resp.Body), `","amount":1000}`) {
		t.Errorf("stored response of %s: %d %v %q", r.key, resp.StatusCode, resp.Headers, resp.Body)
	}
}

func (r run) wantFailure(t *testing.T, stderrHas string) {
	t.Helper()
	var exit *exec.ExitError
	if r.err == nil {
		t.Fatalf("the script succeeded, want a failure\nstdout:\n%s", r.stdout)
	}
	if !errors.As(r.err, &exit) || exit.ExitCode() <= 0 {
		t.Fatalf("script: %v, want a non-zero exit", r.err)
	}
	if strings.Contains(r.stdout, "ok:") {
		t.Errorf("a failing script printed ok:\n%s", r.stdout)
	}
	if !strings.Contains(r.stderr, stderrHas) {
		t.Errorf("stderr %q does not say %q", r.stderr, stderrHas)
	}
}

func TestScripts(t *testing.T) {
	for _, s := range scripts(t) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()

			t.Run("without auth", func(t *testing.T) {
				idemURL := startIdemsvc(t, nil)
				c, err := idem.New(idemURL)
				if err != nil {
					t.Fatal(err)
				}
				first := runScript(t, s, idemURL, "")
				first.wantOK(t, c)
				// A second run uses a new key: its begin acquires again.
				second := runScript(t, s, idemURL, "")
				second.wantOK(t, c)
				if first.key == second.key {
					t.Errorf("both runs used key %q", first.key)
				}
			})

			t.Run("with an API key", func(t *testing.T) {
				const apiKey = "polyglot-test-key"
				keyring := idemtest.Keyring(t, idemtest.Tenant{Name: "polyglot", Key: apiKey})
				idemURL := startIdemsvc(t, keyring)
				c, err := idem.New(idemURL, idem.WithAPIKey(apiKey))
				if err != nil {
					t.Fatal(err)
				}
				r := runScript(t, s, idemURL, apiKey)
				r.wantOK(t, c) // the record is the key's tenant's

				runScript(t, s, idemURL, "").wantFailure(t, "401")
				runScript(t, s, idemURL, "not-the-key").wantFailure(t, "401")
			})

			// A replay that is not the completed response makes the script
			// fail: a proxy alters the replayed begin's answer.
			for name, tamper := range map[string][2]string{
				"other body":        {`"body":"`, `"body":"tampered `},
				"other status code": {`"status_code":201`, `"status_code":200`},
				"other header":      {`"Content-Type":"application/json"`, `"Content-Type":"text/plain"`},
				"acquired again":    {`"status":"completed"`, `"status":"acquired"`},
			} {
				t.Run("replay with "+name, func(t *testing.T) {
					idemURL := startIdemsvc(t, nil)
					proxy := tamperingProxy(t, idemURL, tamper[0], tamper[1])
					runScript(t, s, proxy, "").wantFailure(t, "replay")
				})
			}

			t.Run("idemsvc unreachable", func(t *testing.T) {
				srv := httptest.NewServer(http.NotFoundHandler())
				srv.Close()
				runScript(t, s, srv.URL, "").wantFailure(t, "cannot reach idemsvc")
			})
		})
	}
}

// tamperingProxy serves a proxy of idemURL that replaces old with new in
// the answers of begin calls that replay (200).
func tamperingProxy(t *testing.T, idemURL, old, new string) string {
	t.Helper()
	target, err := url.Parse(idemURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.URL.Path != "/v1/begin" || resp.StatusCode != http.StatusOK {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if !bytes.Contains(body, []byte(old)) {
			t.Errorf("tampering: %q not in the replay %s", old, body)
		}
		body = bytes.ReplaceAll(body, []byte(old), []byte(new))
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	return srv.URL
}
