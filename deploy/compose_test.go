// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/idemsvc/idemsvc/internal/auth"
)

// The demo keys of tenants/tenants.yaml, published in README.md.
const (
	demoKey      = "idemsvc-demo-key-NOT-FOR-PRODUCTION"
	demoAdminKey = "idemsvc-demo-admin-key-NOT-FOR-PRODUCTION"
)

// compose is the part of the Compose file format docker-compose.yaml uses;
// decoded with KnownFields, so a key outside it (a typo) fails.
type compose struct {
	Name       string               `yaml:"name"`
	Services   map[string]service   `yaml:"services"`
	Volumes    map[string]*struct{} `yaml:"volumes"`
	Extensions map[string]yaml.Node `yaml:",inline"` // x-*: anchors
}

type service struct {
	Image       string            `yaml:"image"`
	Build       string            `yaml:"build"`
	Profiles    []string          `yaml:"profiles"`
	Command     []string          `yaml:"command"`
	Entrypoint  []string          `yaml:"entrypoint"`
	EnvFile     []string          `yaml:"env_file"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	DependsOn   dependsOn         `yaml:"depends_on"`
	Healthcheck *struct {
		Test     []string `yaml:"test"`
		Interval string   `yaml:"interval"`
		Timeout  string   `yaml:"timeout"`
		Retries  int      `yaml:"retries"`
	} `yaml:"healthcheck"`
	Restart     string   `yaml:"restart"`
	ReadOnly    bool     `yaml:"read_only"`
	CapDrop     []string `yaml:"cap_drop"`
	SecurityOpt []string `yaml:"security_opt"`
}

type dependency struct {
	Condition string `yaml:"condition"`
	Required  *bool  `yaml:"required"`
}

// dependsOn is depends_on in either of its forms: a list of services, or
// a map of service to condition.
type dependsOn map[string]dependency

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	*d = make(dependsOn)
	if n.Kind == yaml.SequenceNode {
		var names []string
		if err := n.Decode(&names); err != nil {
			return err
		}
		for _, name := range names {
			(*d)[name] = dependency{Condition: "service_started"}
		}
		return nil
	}
	var m map[string]dependency
	if err := decodeStrict(n, &m); err != nil {
		return err
	}
	for k, v := range m {
		(*d)[k] = v
	}
	return nil
}

// decodeStrict decodes n with unknown fields refused, as the file is.
func decodeStrict(n *yaml.Node, v any) error {
	b, err := yaml.Marshal(n)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	return dec.Decode(v)
}

func readCompose(t *testing.T) compose {
	t.Helper()
	data, err := os.ReadFile("docker-compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var c compose
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("docker-compose.yaml: %v", err)
	}
	for k := range c.Extensions {
		if !strings.HasPrefix(k, "x-") {
			t.Errorf("docker-compose.yaml: unknown top-level key %q", k)
		}
	}
	return c
}

// profiles are the Compose profiles the file offers; .env picks the first.
var profiles = []string{"cluster", "single"}

func active(s service, profile string) bool {
	return len(s.Profiles) == 0 || slices.Contains(s.Profiles, profile)
}

// interpolate resolves ${COMPOSE_PROFILES:-...}, the one variable the file
// uses, as Compose would with COMPOSE_PROFILES=profile.
func interpolate(s, profile string) string {
	return regexp.MustCompile(`\$\{COMPOSE_PROFILES(:-[^}]*)?\}`).ReplaceAllString(s, profile)
}

func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := make(map[string]string)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not KEY=value", path, line)
		}
		env[k] = v
	}
	return env
}

// serviceEnv is what a service's container gets: env files, then
// environment, under profile.
func serviceEnv(t *testing.T, s service, profile string) map[string]string {
	env := make(map[string]string)
	for _, f := range s.EnvFile {
		for k, v := range readEnvFile(t, interpolate(f, profile)) {
			env[k] = v
		}
	}
	for k, v := range s.Environment {
		env[k] = v
	}
	return env
}

func isIdemsvc(s service) bool { return s.Build == ".." }

func TestComposeFile(t *testing.T) {
	c := readCompose(t)
	known := idemsvcVars(t)

	envFile := readEnvFile(t, ".env")
	if envFile["COMPOSE_PROFILES"] != profiles[0] {
		t.Errorf(".env: COMPOSE_PROFILES=%q, want %q", envFile["COMPOSE_PROFILES"], profiles[0])
	}
	for name, s := range c.Services {
		for _, p := range s.Profiles {
			if !slices.Contains(profiles, p) {
				t.Errorf("%s: profile %q is not one of %v", name, p, profiles)
			}
		}
		if s.Image == "" {
			t.Errorf("%s: no image", name)
		}
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if strings.HasPrefix(src, ".") {
				if _, err := os.Stat(src); err != nil {
					t.Errorf("%s: mounts %s: %v", name, src, err)
				}
			} else if _, ok := c.Volumes[src]; !ok {
				t.Errorf("%s: volume %q is not declared", name, src)
			}
		}
		for _, p := range s.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("%s: port %s is not bound to 127.0.0.1 (the tenants file's keys are public)", name, p)
			}
		}
	}

	for _, profile := range profiles {
		redis := 0
		for name, s := range c.Services {
			if !active(s, profile) {
				continue
			}
			for dep, d := range s.DependsOn {
				ds, ok := c.Services[dep]
				switch {
				case !ok:
					t.Errorf("%s depends on %s, which is no service", name, dep)
				case !active(ds, profile) && (d.Required == nil || *d.Required):
					t.Errorf("profile %s: %s requires %s, which the profile does not start", profile, name, dep)
				case d.Condition == "service_healthy" && ds.Healthcheck == nil:
					t.Errorf("%s waits for %s to be healthy, which has no healthcheck", name, dep)
				}
			}
			if strings.HasPrefix(s.Image, "redis:") && len(s.Command) > 0 && s.Command[0] == "redis-server" {
				redis++
			}
			if !isIdemsvc(s) {
				continue
			}
			env := serviceEnv(t, s, profile)
			for k := range env {
				if !known[k] {
					t.Errorf("profile %s: %s sets %s, which idemsvc does not know (see go run ./cmd/idemsvc -h)", profile, name, k)
				}
			}
			modes := 0
			for _, k := range []string{"IDEMSVC_REDIS_URL", "IDEMSVC_REDIS_CLUSTER_ADDRS", "IDEMSVC_REDIS_SENTINEL_ADDRS"} {
				if env[k] != "" {
					modes++
					for _, addr := range redisAddrs(k, env[k]) {
						host, _, err := net.SplitHostPort(addr)
						if err != nil {
							t.Errorf("%s: %s: %v", name, k, err)
						} else if hs, ok := c.Services[host]; !ok || !active(hs, profile) {
							t.Errorf("profile %s: %s: %s names %s, which the profile does not start", profile, name, k, host)
						}
					}
				}
			}
			if modes != 1 {
				t.Errorf("profile %s: %s has %d Redis settings, want 1", profile, name, modes)
			}
			if f := env["IDEMSVC_TENANTS_FILE"]; f == "" || !mountedFrom(s, f, "./tenants") {
				t.Errorf("%s: IDEMSVC_TENANTS_FILE=%q is not in the mounted ./tenants folder", name, f)
			}
		}
		if redis == 0 {
			t.Errorf("profile %s starts no Redis", profile)
		}
	}
}

func redisAddrs(setting, value string) []string {
	if setting == "IDEMSVC_REDIS_URL" {
		host := strings.TrimPrefix(strings.TrimPrefix(value, "redis://"), "rediss://")
		host, _, _ = strings.Cut(host, "/")
		if _, h, ok := strings.Cut(host, "@"); ok {
			host = h
		}
		return []string{host}
	}
	return strings.Split(value, ",")
}

// mountedFrom reports whether the container path file lies in a folder
// that s mounts from src.
func mountedFrom(s service, file, src string) bool {
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[0] == src && strings.HasPrefix(file, parts[1]+"/") {
			_, err := os.Stat(filepath.Join(src, strings.TrimPrefix(file, parts[1]+"/")))
			return err == nil
		}
	}
	return false
}

// The Cluster: six nodes, each announcing its service name, and an init
// container that creates the Cluster from exactly those nodes.
func TestComposeRedisCluster(t *testing.T) {
	c := readCompose(t)
	var nodes []string
	for name, s := range c.Services {
		if !slices.Contains(s.Profiles, "cluster") || !strings.HasPrefix(s.Image, "redis:") || len(s.Command) == 0 || s.Command[0] != "redis-server" {
			continue
		}
		nodes = append(nodes, name)
		i := slices.Index(s.Command, "--cluster-announce-hostname")
		if i < 0 || i+1 >= len(s.Command) || s.Command[i+1] != name {
			t.Errorf("%s does not announce itself as %s: %v", name, name, s.Command)
		}
		if !slices.Contains(s.Volumes, "./redis/cluster.conf:/usr/local/etc/redis/redis.conf:ro") || s.Command[1] != "/usr/local/etc/redis/redis.conf" {
			t.Errorf("%s does not run redis/cluster.conf", name)
		}
	}
	slices.Sort(nodes)
	if len(nodes) != 6 {
		t.Fatalf("cluster nodes %v, want 6 (3 masters, 1 replica each)", nodes)
	}
	init := c.Services["redis-cluster-init"]
	script := strings.Join(init.Command, "\n")
	if !strings.Contains(script, `nodes="`+strings.Join(nodes, " ")+`"`) ||
		!strings.Contains(script, "--cluster create") || !strings.Contains(script, "--cluster-replicas 1") || !strings.Contains(script, "--cluster-yes") {
		t.Errorf("redis-cluster-init does not create the Cluster of %v:\n%s", nodes, script)
	}
	for _, n := range nodes {
		if d, ok := init.DependsOn[n]; !ok || d.Condition != "service_healthy" {
			t.Errorf("redis-cluster-init does not wait for %s to be healthy", n)
		}
	}
	for name, s := range c.Services {
		if isIdemsvc(s) && init.Profiles[0] == "cluster" {
			if d := s.DependsOn["redis-cluster-init"]; d.Condition != "service_completed_successfully" {
				t.Errorf("%s does not wait for redis-cluster-init to complete", name)
			}
		}
	}
}

// Both Redis configurations have what the README's "Operating Redis for
// idemsvc" requires.
func TestRedisConfig(t *testing.T) {
	for _, f := range []string{"redis/cluster.conf", "redis/single.conf"} {
		conf := readRedisConf(t, f)
		for k, want := range map[string]string{"maxmemory-policy": "noeviction", "appendonly": "yes"} {
			if conf[k] != want {
				t.Errorf("%s: %s is %q, want %q", f, k, conf[k], want)
			}
		}
		if conf["maxmemory"] == "" {
			t.Errorf("%s: no maxmemory: a full Redis should refuse writes (readyz: writable) before the host runs out", f)
		}
	}
	conf := readRedisConf(t, "redis/cluster.conf")
	if conf["cluster-enabled"] != "yes" || conf["cluster-preferred-endpoint-type"] != "hostname" {
		t.Errorf("redis/cluster.conf: cluster-enabled %q, cluster-preferred-endpoint-type %q", conf["cluster-enabled"], conf["cluster-preferred-endpoint-type"])
	}
}

func readRedisConf(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	conf := make(map[string]string)
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, _ := strings.Cut(line, " ")
		if _, dup := conf[k]; dup {
			t.Errorf("%s: %s set twice", path, k)
		}
		conf[k] = strings.TrimSpace(v)
	}
	return conf
}

// Prometheus scrapes every idemsvc replica, at the port it listens on.
func TestPrometheusConfig(t *testing.T) {
	data, err := os.ReadFile("prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Global struct {
			ScrapeInterval     string `yaml:"scrape_interval"`
			EvaluationInterval string `yaml:"evaluation_interval"`
		} `yaml:"global"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	c := readCompose(t)
	want := map[string]bool{}
	for name, s := range c.Services {
		if isIdemsvc(s) {
			_, port, _ := net.SplitHostPort(s.Environment["IDEMSVC_LISTEN"])
			want[name+":"+port] = true
		}
	}
	got := map[string]bool{}
	for _, sc := range cfg.ScrapeConfigs {
		if sc.JobName != "idemsvc" {
			continue
		}
		if sc.MetricsPath != "/metrics" {
			t.Errorf("job idemsvc: metrics_path %q", sc.MetricsPath)
		}
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				got[target] = true
			}
		}
	}
	if fmt.Sprint(sorted(got)) != fmt.Sprint(sorted(want)) || len(want) != 2 {
		t.Errorf("job idemsvc scrapes %v, want the two replicas %v", sorted(got), sorted(want))
	}
}

// The demo tenants file is valid, and the demo keys README.md gives act for
// its tenants.
func TestDemoTenants(t *testing.T) {
	k, _, err := auth.LoadFile("tenants/tenants.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]auth.Principal{
		demoKey:      {Tenant: "demo"},
		demoAdminKey: {Tenant: "ops", Admin: true},
	} {
		p, ok := k.Lookup(key)
		if !ok || p != want {
			t.Errorf("key %q: %+v %v, want %+v", key, p, ok, want)
		}
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	tenants, _ := os.ReadFile("tenants/tenants.yaml")
	for _, f := range [][]byte{readme, tenants} {
		if !bytes.Contains(f, []byte(demoKey)) || !bytes.Contains(f, []byte("NOT FOR PRODUCTION")) {
			t.Errorf("the demo key and its warning are not in both README.md and tenants/tenants.yaml")
		}
	}
}
