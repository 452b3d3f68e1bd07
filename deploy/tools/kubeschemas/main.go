// SPDX-License-Identifier: Apache-2.0

// Command kubeschemas writes the JSON schemas kubeconform validates
// Kubernetes objects with, one file per kind, from Kubernetes' own OpenAPI
// document (api/openapi-spec/swagger.json of the k8s.io/kubernetes Go
// module) and from CustomResourceDefinitions (JSON), without a download
// from anywhere but the Go module proxy (see scripts/lint-deploy.sh).
//
//	go run ./deploy/tools/kubeschemas -out DIR -swagger swagger.json [-crd crd.json ...]
//
// Files are named as kubeconform's default registry names them,
// <kind>[-<group's first label>]-<version>.json (deployment-apps-v1.json,
// service-v1.json), for -schema-location 'DIR/{{ .ResourceKind }}{{ .KindSuffix }}.json'.
// Each file stands alone: the definitions it refers to are copied into it.
// The schemas are strict, as kubeconform's -strict ones: an object with
// known properties refuses others, so a misspelt field fails. As the API
// server does, an int-or-string takes either, a quantity a string or a
// number, and an optional field may be null.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	out := flag.String("out", "", "folder to write the schemas to")
	swagger := flag.String("swagger", "", "Kubernetes' OpenAPI v2 document (api/openapi-spec/swagger.json)")
	var crds stringList
	flag.Var(&crds, "crd", "a CustomResourceDefinition as JSON (repeatable)")
	flag.Parse()
	if *out == "" || *swagger == "" && len(crds) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*out, *swagger, crds); err != nil {
		fmt.Fprintln(os.Stderr, "kubeschemas:", err)
		os.Exit(1)
	}
}

func run(out, swagger string, crds []string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	written := make(map[string]string) // file -> group/version/kind
	write := func(group, version, kind string, schema map[string]any) error {
		name := fileName(group, version, kind)
		gvk := group + "/" + version + "/" + kind
		if prev, dup := written[name]; dup {
			return fmt.Errorf("%s and %s would both be %s", prev, gvk, name)
		}
		written[name] = gvk
		data, err := json.Marshal(schema)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(out, name), data, 0o644)
	}
	if swagger != "" {
		if err := fromSwagger(swagger, write); err != nil {
			return err
		}
	}
	for _, f := range crds {
		if err := fromCRD(f, write); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	fmt.Fprintf(os.Stderr, "kubeschemas: %d schemas in %s\n", len(written), out)
	return nil
}

// fileName is the file kubeconform looks for: kind, the group's first
// label and the version (kubeconform's {{ .ResourceKind }}{{ .KindSuffix }}).
func fileName(group, version, kind string) string {
	suffix := ""
	if group != "" {
		suffix = "-" + strings.ToLower(strings.Split(group, ".")[0])
	}
	return strings.ToLower(kind) + suffix + "-" + strings.ToLower(version) + ".json"
}

type writeFunc func(group, version, kind string, schema map[string]any) error

func apiVersion(group, version string) string {
	if group == "" {
		return version
	}
	return group + "/" + version
}

func fromSwagger(path string, write writeFunc) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if len(doc.Definitions) == 0 {
		return fmt.Errorf("%s: no definitions", path)
	}
	defs := make(map[string]any, len(doc.Definitions))
	for name, d := range doc.Definitions {
		defs[name] = convert(d)
	}
	// Quantity: a string ("100m", "1Gi") or a number, as the API server takes it.
	const quantity = "io.k8s.apimachinery.pkg.api.resource.Quantity"
	if _, ok := defs[quantity]; ok {
		defs[quantity] = map[string]any{"oneOf": []any{
			map[string]any{"type": "string"}, map[string]any{"type": "number"}, map[string]any{"type": "null"}}}
	}
	names := make([]string, 0, len(doc.Definitions))
	for name := range doc.Definitions {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		gvks, _ := doc.Definitions[name]["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			gvk, _ := g.(map[string]any)
			group, _ := gvk["group"].(string)
			version, _ := gvk["version"].(string)
			kind, _ := gvk["kind"].(string)
			if version == "" || kind == "" {
				return fmt.Errorf("%s: x-kubernetes-group-version-kind %v", name, g)
			}
			root := deepCopy(defs[name]).(map[string]any)
			root["type"] = "object" // the object itself is not null
			pinKind(root, group, version, kind)
			root["$schema"] = "http://json-schema.org/draft-07/schema#"
			closure := make(map[string]any)
			collectRefs(root, defs, closure)
			if len(closure) > 0 {
				root["definitions"] = closure
			}
			if err := write(group, version, kind, root); err != nil {
				return err
			}
		}
	}
	return nil
}

// pinKind makes apiVersion and kind of root the one version and kind.
func pinKind(root map[string]any, group, version, kind string) {
	props, _ := root["properties"].(map[string]any)
	if props == nil {
		return
	}
	if _, ok := props["apiVersion"]; ok {
		props["apiVersion"] = map[string]any{"type": "string", "enum": []any{apiVersion(group, version)}}
	}
	if _, ok := props["kind"]; ok {
		props["kind"] = map[string]any{"type": "string", "enum": []any{kind}}
	}
}

// collectRefs copies into closure every definition v refers to, at any depth.
func collectRefs(v any, defs map[string]any, closure map[string]any) {
	switch v := v.(type) {
	case map[string]any:
		if ref, ok := v["$ref"].(string); ok {
			name := strings.TrimPrefix(ref, "#/definitions/")
			if _, seen := closure[name]; !seen {
				d, ok := defs[name]
				if !ok {
					d = map[string]any{} // unknown: anything
				}
				closure[name] = d
				collectRefs(d, defs, closure)
			}
		}
		for k, x := range v {
			if k != "definitions" {
				collectRefs(x, defs, closure)
			}
		}
	case []any:
		for _, x := range v {
			collectRefs(x, defs, closure)
		}
	}
}

// convert turns an OpenAPI schema into a strict JSON schema: objects with
// properties refuse unknown ones (unless the schema keeps unknown fields),
// int-or-string takes either, and (below the root) null is accepted, as
// the API server does for an optional field. Descriptions and the
// x-kubernetes- annotations are dropped.
func convert(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			switch {
			case k == "description" || k == "example" || k == "x-kubernetes-group-version-kind":
			case k == "properties" || k == "patternProperties" || k == "definitions":
				props := make(map[string]any)
				for name, p := range x.(map[string]any) {
					props[name] = convert(p)
				}
				out[k] = props
			case strings.HasPrefix(k, "x-"):
			default:
				out[k] = convert(x)
			}
		}
		intOrString := v["format"] == "int-or-string" || v["x-kubernetes-int-or-string"] == true
		if intOrString {
			delete(out, "type")
			delete(out, "format")
			delete(out, "anyOf")
			out["oneOf"] = []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}, map[string]any{"type": "null"}}
		}
		preserve := v["x-kubernetes-preserve-unknown-fields"] == true
		if _, hasProps := v["properties"]; hasProps && !preserve {
			if _, set := v["additionalProperties"]; !set {
				out["additionalProperties"] = false
			}
		}
		if t, ok := out["type"].(string); ok {
			out["type"] = []any{t, "null"}
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = convert(x)
		}
		return out
	}
	return v
}

func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[k] = deepCopy(x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = deepCopy(x)
		}
		return out
	}
	return v
}

// fromCRD writes a schema for each served version of a
// CustomResourceDefinition (apiextensions.k8s.io/v1, as JSON).
func fromCRD(path string, write writeFunc) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var crd struct {
		Kind string `json:"kind"`
		Spec struct {
			Group string `json:"group"`
			Names struct {
				Kind string `json:"kind"`
			} `json:"names"`
			Versions []struct {
				Name   string `json:"name"`
				Served bool   `json:"served"`
				Schema struct {
					OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(data, &crd); err != nil {
		return err
	}
	if crd.Kind != "CustomResourceDefinition" || crd.Spec.Names.Kind == "" || len(crd.Spec.Versions) == 0 {
		return errors.New("not a CustomResourceDefinition with versions")
	}
	for _, v := range crd.Spec.Versions {
		if !v.Served || v.Schema.OpenAPIV3Schema == nil {
			continue
		}
		root := convert(v.Schema.OpenAPIV3Schema).(map[string]any)
		root["type"] = "object"
		props, _ := root["properties"].(map[string]any)
		if props == nil {
			props = map[string]any{}
			root["properties"] = props
		}
		// A CRD's schema leaves out metadata; the API server checks it.
		props["apiVersion"] = map[string]any{}
		props["kind"] = map[string]any{}
		props["metadata"] = map[string]any{"type": "object"}
		pinKind(root, crd.Spec.Group, v.Name, crd.Spec.Names.Kind)
		root["$schema"] = "http://json-schema.org/draft-07/schema#"
		if err := write(crd.Spec.Group, v.Name, crd.Spec.Names.Kind, root); err != nil {
			return err
		}
	}
	return nil
}
