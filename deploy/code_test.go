// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// What the deployment files may name, read from the code they configure.

// idemsvcVars are the environment variables idemsvc reads: one per flag
// of cmd/idemsvc/config.go (fs.String("redis-url", ...) is
// IDEMSVC_REDIS_URL), as `idemsvc -h` lists them.
func idemsvcVars(t *testing.T) map[string]bool {
	t.Helper()
	f := parseGo(t, "../cmd/idemsvc/config.go")
	vars := make(map[string]bool)
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "fs" {
			return true
		}
		switch sel.Sel.Name {
		case "String", "Int", "Int64", "Bool", "Duration", "Float64", "Uint", "Uint64":
		default:
			return true
		}
		if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
			name, _ := strconv.Unquote(lit.Value)
			vars["IDEMSVC_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))] = true
		}
		return true
	})
	if len(vars) < 20 || !vars["IDEMSVC_REDIS_CLUSTER_ADDRS"] || !vars["IDEMSVC_TENANTS_FILE"] {
		t.Fatalf("read %d settings from cmd/idemsvc/config.go (%v): has the way flags are declared changed?", len(vars), sorted(vars))
	}
	return vars
}

// idemproxyVars are the environment variables idemproxy reads: the values
// of the vars map of cmd/idemproxy/config.go.
func idemproxyVars(t *testing.T) map[string]bool {
	t.Helper()
	f := parseGo(t, "../cmd/idemproxy/config.go")
	vars := make(map[string]bool)
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "vars" || len(vs.Values) != 1 {
			return true
		}
		lit, ok := vs.Values[0].(*ast.CompositeLit)
		if !ok {
			return true
		}
		for _, e := range lit.Elts {
			if kv, ok := e.(*ast.KeyValueExpr); ok {
				if v, ok := kv.Value.(*ast.BasicLit); ok && v.Kind == token.STRING {
					name, _ := strconv.Unquote(v.Value)
					vars[name] = true
				}
			}
		}
		return false
	})
	if !vars["IDEMPROXY_UPSTREAM"] || !vars["IDEMSVC_URL"] {
		t.Fatalf("read %v from cmd/idemproxy/config.go: has the vars map changed?", sorted(vars))
	}
	return vars
}

func parseGo(t *testing.T, path string) *ast.File {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// metric is a Prometheus metric the code defines.
type metric struct {
	kind   string          // Counter, Gauge, Histogram, Summary
	labels map[string]bool // its own labels, without the target's (job, instance)
}

var (
	metricsOnce sync.Once
	metricsDef  map[string]metric
	metricsErr  error
)

// definedMetrics are the metrics idemsvc and idemproxy define: every
// prometheus.New<Kind>[Vec|Func](...) in the Go sources under cmd/ and
// internal/, with its name and labels, plus the standard ones of the Go and
// process collectors that both register.
func definedMetrics(t *testing.T) map[string]metric {
	t.Helper()
	metricsOnce.Do(func() { metricsDef, metricsErr = readMetrics() })
	if metricsErr != nil {
		t.Fatal(metricsErr)
	}
	return metricsDef
}

var (
	newCollector = regexp.MustCompile(`prometheus\.New(Counter|Gauge|Histogram|Summary)(Vec|Func)?\(`)
	metricName   = regexp.MustCompile(`Name:\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"`)
	labelList    = regexp.MustCompile(`\},\s*\[\]string\{([^}]*)\}`)
	constLabels  = regexp.MustCompile(`ConstLabels:\s*prometheus\.Labels\{([^}]*)\}`)
	quoted       = regexp.MustCompile(`"([^"]*)"\s*:?`)
)

func readMetrics() (map[string]metric, error) {
	defs := make(map[string]metric)
	for _, root := range []string{"../cmd", "../internal"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			text := string(src)
			for _, m := range newCollector.FindAllStringSubmatchIndex(text, -1) {
				rest := text[m[1]:]
				if next := newCollector.FindStringIndex(rest); next != nil {
					rest = rest[:next[0]]
				}
				nm := metricName.FindStringSubmatchIndex(rest)
				if nm == nil {
					continue
				}
				name := rest[nm[2]:nm[3]]
				def := metric{kind: text[m[2]:m[3]], labels: make(map[string]bool)}
				// The options' closing brace, then the label names of a Vec.
				if ls := labelList.FindStringSubmatch(rest[nm[1]:]); ls != nil {
					for _, q := range quoted.FindAllStringSubmatch(ls[1], -1) {
						def.labels[q[1]] = true
					}
				}
				if cl := constLabels.FindStringSubmatch(rest); cl != nil {
					for _, q := range quoted.FindAllStringSubmatch(cl[1], -1) {
						if strings.HasSuffix(strings.TrimSpace(q[0]), ":") {
							def.labels[q[1]] = true
						}
					}
				}
				defs[name] = def
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	// The Go and process collectors (registered by internal/handlers and
	// cmd/idemproxy) export these under their standard names; only the
	// ones a dashboard is likely to use are listed.
	for name, kind := range map[string]string{
		"go_goroutines":                 "Gauge",
		"go_gc_duration_seconds":        "Summary",
		"go_memstats_heap_inuse_bytes":  "Gauge",
		"process_cpu_seconds_total":     "Counter",
		"process_resident_memory_bytes": "Gauge",
		"process_open_fds":              "Gauge",
		"process_start_time_seconds":    "Gauge",
	} {
		defs[name] = metric{kind: kind, labels: map[string]bool{}}
	}
	// Every Prometheus target has "up".
	defs["up"] = metric{kind: "Gauge", labels: map[string]bool{}}
	return defs, nil
}

func TestDefinedMetrics(t *testing.T) {
	defs := definedMetrics(t)
	for name, want := range map[string][]string{
		"idemsvc_http_requests_total":           {"route", "outcome", "status"},
		"idemsvc_http_request_duration_seconds": {"route"},
		"idemsvc_begins_total":                  {"tenant", "outcome"},
		"idemsvc_limit_rejections_total":        {"tenant", "limit"},
		"idemsvc_build_info":                    {"version", "revision", "goversion"},
		"idemsvc_store_calls_in_flight":         nil,
		"idemproxy_requests_total":              {"outcome", "status"},
		"idemproxy_upstream_duration_seconds":   nil,
	} {
		def, ok := defs[name]
		if !ok {
			t.Errorf("%s not found in the sources", name)
			continue
		}
		if got := sorted(def.labels); strings.Join(got, ",") != strings.Join(sortedList(want), ",") {
			t.Errorf("%s: labels %v, want %v", name, got, sortedList(want))
		}
	}
	if defs["idemsvc_http_request_duration_seconds"].kind != "Histogram" {
		t.Errorf("idemsvc_http_request_duration_seconds: kind %q", defs["idemsvc_http_request_duration_seconds"].kind)
	}
}

func sorted(m map[string]bool) []string {
	s := make([]string, 0, len(m))
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

func sortedList(s []string) []string {
	s = append([]string(nil), s...)
	sort.Strings(s)
	return s
}
