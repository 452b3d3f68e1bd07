// SPDX-License-Identifier: Apache-2.0

package api_test

import (
	"maps"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"go.yaml.in/yaml/v3"

	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// The limits api/openapi.yaml states are the defaults the service
// enforces: the store's Limits and the handler's body and wait bounds.
func TestSpecStatesTheDefaultLimits(t *testing.T) {
	spec, err := openapi3.NewLoader().LoadFromFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	l := statemachine.DefaultLimits()
	schema := func(name string) *openapi3.Schema {
		s := spec.Components.Schemas[name]
		if s == nil || s.Value == nil {
			t.Fatalf("no schema %s", name)
		}
		return s.Value
	}
	begin := schema("BeginRequest").Properties
	for _, tt := range []struct {
		what     string
		got      float64
		want     float64
		gotUpper *float64
		wantMax  float64
	}{
		{"LeaseMs", *schema("LeaseMs").Min, float64(l.MinLease / time.Millisecond), schema("LeaseMs").Max, float64(l.MaxLease / time.Millisecond)},
		{"RetentionS", *schema("RetentionS").Min, float64(l.MinRetention / time.Second), schema("RetentionS").Max, float64(l.MaxRetention / time.Second)},
		{"wait_ms", *begin["wait_ms"].Value.Min, 0, begin["wait_ms"].Value.Max, float64(handlers.DefaultMaxWait / time.Millisecond)},
	} {
		if tt.got != tt.want || tt.gotUpper == nil || *tt.gotUpper != tt.wantMax {
			t.Errorf("%s: the spec says %v to %v, the service %v to %v", tt.what, tt.got, tt.gotUpper, tt.want, tt.wantMax)
		}
	}
	// Lengths of strings that may hold any UTF-8 are in bytes, which
	// maxLength (characters) cannot state: x-max-bytes does, and maxLength
	// beside it bounds validators that count characters (n bytes are at
	// most n characters).
	for _, tt := range []struct {
		field *openapi3.SchemaRef
		name  string
		want  int
	}{
		{begin["fingerprint"], "fingerprint", l.MaxFingerprintBytes},
		{begin["owner"], "owner", l.MaxOwnerBytes},
		{schema("FailRequest").Properties["error"], "error", l.MaxErrorBytes},
	} {
		got, _ := tt.field.Value.Extensions["x-max-bytes"].(float64)
		if int(got) != tt.want || tt.field.Value.MaxLength == nil || int(*tt.field.Value.MaxLength) != tt.want {
			t.Errorf("%s: the spec says x-max-bytes %v (maxLength %v), the service %d bytes", tt.name, got, tt.field.Value.MaxLength, tt.want)
		}
	}
	if got := schema("Key").MaxLength; got == nil || int(*got) != l.MaxKeyBytes {
		t.Errorf("key: the spec's maxLength is %v, the service's %d", got, l.MaxKeyBytes)
	}
	for _, name := range []string{"BeginBatchRequest", "FinishBatchRequest"} {
		if got := schema(name).Properties["items"].Value.MaxItems; got == nil || int(*got) != handlers.DefaultMaxBatch {
			t.Errorf("%s: the spec's maxItems is %v, the service's %d", name, got, handlers.DefaultMaxBatch)
		}
	}
}

// loadSpec loads api/openapi.yaml.
func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	spec, err := openapi3.NewLoader().LoadFromFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

// The description generates natural clients in other languages too (the
// generated Go types are pinned by the code that uses them):
//   - optional request fields stay optional: an inline default makes
//     openapi-typescript, for one, declare the field required, so no
//     request field or query parameter has one (the description states it);
//   - integers are plain numbers: format int64 makes generators produce
//     BigInt and the like (Go code gets int64 from x-go-type);
//   - a problem's kind is its type, an enum of exactly the kinds the
//     service answers with, and each problem response narrows it to the
//     kinds of its status;
//   - the first server is a URL a client can use as its base URL.
func TestSpecGeneratesNaturalClients(t *testing.T) {
	spec := loadSpec(t)

	t.Run("no default on request fields", func(t *testing.T) {
		seen := map[*openapi3.Schema]bool{}
		var walk func(where string, ref *openapi3.SchemaRef)
		walk = func(where string, ref *openapi3.SchemaRef) {
			if ref == nil || ref.Value == nil || seen[ref.Value] {
				return
			}
			s := ref.Value
			seen[s] = true
			if s.Default != nil {
				t.Errorf("%s has default %v: state it in the description instead", where, s.Default)
			}
			for name, p := range s.Properties {
				walk(where+"."+name, p)
			}
			walk(where+"[]", s.Items)
			walk(where+"{}", s.AdditionalProperties.Schema)
			for _, list := range []openapi3.SchemaRefs{s.AllOf, s.OneOf, s.AnyOf} {
				for i, m := range list {
					walk(where+"/"+strconv.Itoa(i), m)
				}
			}
		}
		requests := 0
		for path, item := range spec.Paths.Map() {
			for method, op := range item.Operations() {
				params := append(slices.Clone(item.Parameters), op.Parameters...)
				for _, p := range params {
					walk(method+" "+path+" ?"+p.Value.Name, p.Value.Schema)
				}
				if op.RequestBody != nil {
					for mt, c := range op.RequestBody.Value.Content {
						requests++
						walk(method+" "+path+" "+mt, c.Schema)
					}
				}
			}
		}
		if requests == 0 {
			t.Fatal("no request bodies found")
		}
	})

	t.Run("no int64", func(t *testing.T) {
		b, err := os.ReadFile("../../api/openapi.yaml")
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := yaml.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		var walk func(where string, v any)
		walk = func(where string, v any) {
			switch v := v.(type) {
			case map[string]any:
				if v["format"] == "int64" {
					t.Errorf("%s has format int64: leave the format out (x-go-type: int64 for Go)", where)
				}
				for k, e := range v {
					walk(where+"/"+k, e)
				}
			case []any:
				for i, e := range v {
					walk(where+"/"+strconv.Itoa(i), e)
				}
			}
		}
		walk("#", doc)
	})

	t.Run("problem types", func(t *testing.T) {
		served := handlers.ProblemTypes()
		problem := spec.Components.Schemas["Problem"]
		if problem == nil || problem.Value.Properties["type"] == nil {
			t.Fatal("no Problem.type")
		}
		if got, want := enumStrings(problem.Value.Properties["type"].Value), slices.Sorted(maps.Keys(served)); !slices.Equal(got, want) {
			t.Errorf("Problem.type's enum is\n%q\nthe service answers with\n%q", got, want)
		}
		// code is the kind's name: the last path segment of type.
		var names []string
		for _, typ := range slices.Sorted(maps.Keys(served)) {
			names = append(names, typ[strings.LastIndexByte(typ, '/')+1:])
		}
		sort.Strings(names)
		if problem.Value.Properties["code"] == nil || !slices.Contains(problem.Value.Required, "code") {
			t.Fatal("Problem.code is missing or optional")
		}
		if got := enumStrings(problem.Value.Properties["code"].Value); !slices.Equal(got, names) {
			t.Errorf("Problem.code's enum is\n%q\nthe service's kinds are\n%q", got, names)
		}
		// Each problem response names the kinds it can carry, each one of
		// the response's status.
		checked := 0
		for path, item := range spec.Paths.Map() {
			for method, op := range item.Operations() {
				for code, r := range op.Responses.Map() {
					c := r.Value.Content["application/problem+json"]
					if c == nil {
						continue
					}
					where := method + " " + path + " " + code
					s := c.Schema.Value
					var kinds, codes []string
					for _, m := range s.AllOf {
						if m.Value != problem.Value && m.Value.Properties["type"] != nil {
							kinds = append(kinds, enumStrings(m.Value.Properties["type"].Value)...)
						}
						if m.Value != problem.Value && m.Value.Properties["code"] != nil {
							codes = append(codes, enumStrings(m.Value.Properties["code"].Value)...)
						}
					}
					var named []string
					for _, k := range kinds {
						named = append(named, k[strings.LastIndexByte(k, '/')+1:])
					}
					if !slices.Equal(codes, named) {
						t.Errorf("%s: code narrowed to %q, type to %q", where, codes, kinds)
					}
					if len(s.AllOf) == 0 || s.AllOf[0].Value != problem.Value || len(kinds) == 0 {
						t.Errorf("%s: not a Problem narrowed to its kinds", where)
						continue
					}
					status, _ := strconv.Atoi(code)
					for _, k := range kinds {
						if served[k] != status {
							t.Errorf("%s: kind %s, which the service answers with status %d", where, k, served[k])
						}
					}
					checked++
				}
			}
		}
		if checked == 0 {
			t.Fatal("no problem responses found")
		}
	})

	t.Run("servers", func(t *testing.T) {
		if len(spec.Servers) == 0 {
			t.Fatal("no servers")
		}
		u, err := url.Parse(spec.Servers[0].URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			t.Errorf("servers[0] is %q: a client needs an absolute http URL", spec.Servers[0].URL)
		}
	})
}

// enumStrings is s's enum, sorted.
func enumStrings(s *openapi3.Schema) []string {
	var out []string
	for _, v := range s.Enum {
		str, _ := v.(string)
		out = append(out, str)
	}
	sort.Strings(out)
	return out
}
