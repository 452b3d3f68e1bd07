// SPDX-License-Identifier: Apache-2.0

package sidecar

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/redisstore"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// compose is the part of a compose file the test reads.
type compose struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Build       string            `yaml:"build"`
		Entrypoint  []string          `yaml:"entrypoint"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		NetworkMode string            `yaml:"network_mode"`
		DependsOn   []string          `yaml:"depends_on"`
	} `yaml:"services"`
}

// The compose file is valid (docker compose config, where Docker has the
// compose plugin), its services refer to services it defines, and the
// sidecar it describes, run here without Docker, makes a retried payment
// charge once.
func TestSidecar(t *testing.T) {
	raw, err := os.ReadFile("docker-compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatalf("docker-compose.yaml: %v", err)
	}
	for name, s := range c.Services {
		for _, dep := range s.DependsOn {
			if _, ok := c.Services[dep]; !ok {
				t.Errorf("service %s depends on %s, which is not defined", name, dep)
			}
		}
		if peer, ok := strings.CutPrefix(s.NetworkMode, "service:"); ok {
			if _, ok := c.Services[peer]; !ok {
				t.Errorf("service %s shares the network of %s, which is not defined", name, peer)
			}
		}
	}
	if out, err := exec.Command("docker", "compose", "version").CombinedOutput(); err == nil {
		if out, err := exec.Command("docker", "compose", "-f", "docker-compose.yaml", "config", "-q").CombinedOutput(); err != nil {
			t.Errorf("docker compose config: %v\n%s", err, out)
		}
	} else {
		t.Logf("docker compose config not run: %s", strings.TrimSpace(string(out)))
	}

	// The stack, on loopback: Redis and idemsvc as the test runs them, and
	// the upstream and idemproxy with the compose file's settings, their
	// addresses moved to free ports.
	svc := idemtest.Serve(t, handlers.Config{Store: redisstore.New(redistest.SharedServer(t).Client(t), redisstore.Options{})})
	up := c.Services["upstream"]
	upPort := freePort(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not found: install Node.js (make test does)")
	}
	start(t, exec.Command(node, "upstream.mjs"), env(up.Environment, map[string]string{"PORT": upPort, "HOST": "127.0.0.1"}))

	proxy := c.Services["idemproxy"]
	if got := strings.Join(proxy.Entrypoint, " "); got != "/idemproxy" {
		t.Fatalf("idemproxy's entrypoint is %q, want /idemproxy (the image's second binary)", got)
	}
	bin := filepath.Join(t.TempDir(), "idemproxy")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/idemproxy").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	proxyPort := freePort(t)
	wantUpstream := "http://127.0.0.1:" + up.Environment["PORT"]
	if proxy.Environment["IDEMPROXY_UPSTREAM"] != wantUpstream {
		t.Fatalf("IDEMPROXY_UPSTREAM is %q, want %s: the upstream shares idemproxy's network", proxy.Environment["IDEMPROXY_UPSTREAM"], wantUpstream)
	}
	start(t, exec.Command(bin), env(proxy.Environment, map[string]string{
		"IDEMPROXY_LISTEN":   "127.0.0.1:" + proxyPort,
		"IDEMPROXY_UPSTREAM": "http://127.0.0.1:" + upPort,
		"IDEMSVC_URL":        svc.URL,
	}))
	base := "http://127.0.0.1:" + proxyPort
	idemtest.Eventually(t, 10*time.Second, "idemproxy answers /healthz", func() bool {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})

	// The compose file's curl, twice, with a key of this run's own (the
	// test's Redis is shared).
	var bodies []string
	key := fmt.Sprintf(`"order-%d"`, time.Now().UnixNano())
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, base+"/payments", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || resp.Header.Get("Location") != "/payments/1" {
			t.Fatalf("POST /payments: %d %q Location %q", resp.StatusCode, b, resp.Header.Get("Location"))
		}
		bodies = append(bodies, string(b))
	}
	if bodies[0] != bodies[1] {
		t.Errorf("the retry got %q, the first %q", bodies[1], bodies[0])
	}
	resp, err := http.Get(base + "/charges")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var charges struct{ Charges int }
	if err := json.NewDecoder(resp.Body).Decode(&charges); err != nil || charges.Charges != 1 {
		t.Errorf("charges: %+v %v, want 1", charges, err)
	}
}

// env is the test's environment plus vars, with overrides applied.
func env(vars, overrides map[string]string) []string {
	out := os.Environ()
	for k, v := range vars {
		if o, ok := overrides[k]; ok {
			v = o
		}
		out = append(out, k+"="+v)
	}
	for k, v := range overrides {
		if _, ok := vars[k]; !ok {
			out = append(out, k+"="+v)
		}
	}
	return out
}

// start runs cmd until the test ends, its output in the test's log.
func start(t *testing.T, cmd *exec.Cmd, env []string) {
	t.Helper()
	cmd.Env = env
	out, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		s := bufio.NewScanner(out)
		for s.Scan() {
			t.Log(filepath.Base(cmd.Path)+":", s.Text())
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-logged // the pipe ends with the process
		_ = cmd.Wait()
	})
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}
