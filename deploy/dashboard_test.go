// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// The Grafana dashboard queries only metrics the code defines, with labels
// they have, so it cannot drift from the code unnoticed.
func TestDashboardMetrics(t *testing.T) {
	defs := definedMetrics(t)
	data, err := os.ReadFile("grafana/idemsvc.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("grafana/idemsvc.json: %v", err)
	}
	if dash["uid"] != "idemsvc" || dash["title"] != "idemsvc" {
		t.Errorf("uid %v, title %v", dash["uid"], dash["title"])
	}
	exprs := dashboardQueries(dash)
	if len(exprs) < 20 {
		t.Fatalf("found %d queries in the dashboard", len(exprs))
	}
	used := make(map[string]bool)
	for _, e := range exprs {
		for _, p := range checkPromQL(e, defs) {
			t.Errorf("%s\n\tin %s", p, e)
		}
		for _, m := range promMetrics(e) {
			used[base(m, defs)] = true
		}
	}
	// The rows the dashboard promises: each of these is queried.
	for _, m := range []string{
		"idemsvc_http_requests_total", "idemsvc_http_request_duration_seconds", "idemsvc_begin_duration_seconds",
		"idemsvc_begins_total", "idemsvc_limit_rejections_total", "idemsvc_stored_bytes",
		"idemsvc_store_errors_total", "idemsvc_store_calls_in_flight", "idemsvc_store_overload_refusals_total",
		"idemsvc_waiters", "idemsvc_redis_eviction_allowed", "idemsvc_build_info",
		"idemsvc_tenants_reloads_total", "idemsvc_tenants_file_invalid",
		"idemproxy_requests_total", "idemproxy_upstream_duration_seconds", "idemproxy_upstream_errors_total",
	} {
		if !used[m] {
			t.Errorf("the dashboard does not query %s", m)
		}
	}
	// Panels take the data source from the variable, so the file imports
	// into any Grafana and is provisioned as it is.
	for _, ds := range findAll(dash, "datasource") {
		if m, ok := ds.(map[string]any); ok && m["uid"] != "${datasource}" {
			t.Errorf("a data source is %v, not the variable ${datasource}", m)
		}
	}
}

// dashboardQueries returns every PromQL expression of the dashboard: the
// panels' targets and the variables' label_values queries (as the
// expression they select from).
func dashboardQueries(dash map[string]any) []string {
	var exprs []string
	for _, e := range findAll(dash, "expr") {
		if s, ok := e.(string); ok {
			exprs = append(exprs, s)
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((.*),\s*([a-zA-Z_]\w*)\)$`)
	for _, d := range findAll(dash, "definition") {
		s, _ := d.(string)
		if m := labelValues.FindStringSubmatch(s); m != nil {
			// label_values(sel, label) reads label of sel: checked as sum by (label) (sel).
			exprs = append(exprs, "sum by ("+m[2]+") ("+m[1]+")")
		}
	}
	return exprs
}

// findAll returns the values of every key named key in v, at any depth.
func findAll(v any, key string) []any {
	var out []any
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if k == key {
				out = append(out, x)
			}
			out = append(out, findAll(x, key)...)
		}
	case []any:
		for _, x := range v {
			out = append(out, findAll(x, key)...)
		}
	}
	return out
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promMatchers = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promMatcher  = regexp.MustCompile(`^\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)`)
)

// promKeywords are PromQL's words that are neither functions nor metrics.
var promKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "bool": true, "and": true, "or": true, "unless": true,
	"offset": true, "inf": true, "nan": true}

// promMetrics returns the metric names expr selects: identifiers that are
// not functions (followed by "("), keywords, labels or strings.
func promMetrics(expr string) []string {
	s := promString.ReplaceAllString(expr, `""`)
	s = promRange.ReplaceAllString(s, "")
	s = promGrouping.ReplaceAllString(s, "")
	s = promMatchers.ReplaceAllString(s, "$1")
	var names []string
	for _, loc := range promIdent.FindAllStringIndex(s, -1) {
		word := s[loc[0]:loc[1]]
		if loc[0] > 0 && (s[loc[0]-1] == '$' || s[loc[0]-1] >= '0' && s[loc[0]-1] <= '9' || s[loc[0]-1] == '.') {
			continue // a variable, or part of a number such as 1e3
		}
		if rest := strings.TrimLeft(s[loc[1]:], " "); strings.HasPrefix(rest, "(") || promKeywords[strings.ToLower(word)] {
			continue
		}
		names = append(names, word)
	}
	return names
}

// base is the metric a series name belongs to: a histogram's _bucket,
// _sum and _count, a summary's _sum and _count.
func base(name string, defs map[string]metric) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(name, suffix); ok {
			if d, ok := defs[b]; ok && (d.kind == "Histogram" || suffix != "_bucket" && d.kind == "Summary") {
				return b
			}
		}
	}
	return name
}

// targetLabels are what Prometheus adds to every series of a target.
var targetLabels = map[string]bool{"job": true, "instance": true}

// checkPromQL reports metrics of expr that the code does not define, and
// labels that its metrics do not have.
func checkPromQL(expr string, defs map[string]metric) []string {
	var problems []string
	names := promMetrics(expr)
	labels := map[string]bool{}
	for k := range targetLabels {
		labels[k] = true
	}
	if len(names) == 0 {
		problems = append(problems, "selects no metric")
	}
	for _, n := range names {
		b := base(n, defs)
		d, ok := defs[b]
		if !ok {
			problems = append(problems, "metric "+n+" is not defined in the code")
			continue
		}
		for l := range d.labels {
			labels[l] = true
		}
		if b != n && strings.HasSuffix(n, "_bucket") {
			labels["le"] = true
		}
	}
	s := promString.ReplaceAllString(expr, `""`)
	// Matchers: each label belongs to the metric it selects.
	for _, m := range promMatchers.FindAllStringSubmatch(s, -1) {
		own := map[string]bool{}
		for k := range targetLabels {
			own[k] = true
		}
		if d, ok := defs[base(m[1], defs)]; ok {
			for l := range d.labels {
				own[l] = true
			}
			if strings.HasSuffix(m[1], "_bucket") {
				own["le"] = true
			}
		}
		for _, part := range strings.Split(m[2], ",") {
			if lm := promMatcher.FindStringSubmatch(part); lm != nil && !own[lm[1]] {
				problems = append(problems, "label "+lm[1]+" is not a label of "+m[1])
			}
		}
	}
	// Groupings: each label belongs to some metric of the expression.
	for _, g := range promGrouping.FindAllStringSubmatch(s, -1) {
		for _, l := range strings.Split(g[2], ",") {
			if l = strings.TrimSpace(l); l != "" && !labels[l] {
				problems = append(problems, g[1]+" ("+l+"): no metric of the expression has label "+l)
			}
		}
	}
	return problems
}

func TestCheckPromQL(t *testing.T) {
	defs := definedMetrics(t)
	for expr, bad := range map[string]bool{
		`sum by (route) (rate(idemsvc_http_requests_total{job=~"$job",route=~"/v1/.*"}[$__rate_interval]))`:                       false,
		`histogram_quantile(0.99, sum by (le, outcome) (rate(idemsvc_begin_duration_seconds_bucket{instance=~"$instance"}[5m])))`: false,
		`sum(rate(idemsvc_http_request_duration_seconds_sum[5m])) / sum(rate(idemsvc_http_request_duration_seconds_count[5m]))`:   false,
		`sum by (route) (rate(idemsvc_http_request_total[5m]))`:                                                                   true, // misspelt metric
		`sum by (path) (rate(idemsvc_http_requests_total[5m]))`:                                                                   true, // no such label
		`sum(rate(idemsvc_begins_total{route="/v1/begin"}[5m]))`:                                                                  true, // label of another metric
		`histogram_quantile(0.9, sum by (le) (rate(idemsvc_http_requests_total_bucket[5m])))`:                                     true, // a counter has no buckets
		`sum(rate(idemproxy_requests_total{outcome="replayed"}[1m])) / sum(rate(idemproxy_requests_total[1m]))`:                   false,
		`max(idemsvc_redis_eviction_allowed) or vector(0)`:                                                                        false,
		`idemsvc_build_info{version!=""}`:                                                                                         false,
		`rate(nonexistent_metric_total[1m])`:                                                                                      true,
		`sum by (tenant, limit) (rate(idemsvc_limit_rejections_total{tenant=~"$tenant"}[$__rate_interval])) > 1e3`:                false,
	} {
		problems := checkPromQL(expr, defs)
		if bad != (len(problems) > 0) {
			t.Errorf("%s: problems %v, want bad=%v", expr, problems, bad)
		}
	}
}
