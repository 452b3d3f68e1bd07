// SPDX-License-Identifier: Apache-2.0

// Package api holds the HTTP API of idemsvc: the models, routes and strict
// server interface generated from api/openapi.yaml (server.gen.go), plus
// two hand-written parts. decode.go decodes the request bodies strictly,
// in one pass, through encoding/json/v2's upstream library (the generated
// handlers call it: see strict-http.gen.tmpl); encode.go streams
// the two answers that carry a stored response, so that a large one never
// sits whole in memory.
package api

//go:generate sh -c "go mod download github.com/oapi-codegen/oapi-codegen/v2 && sed 's/runtime.BindJSONBody(r, &body)/decodeBody(r, \\&body)/' \"$(go list -m -f {{.Dir}} github.com/oapi-codegen/oapi-codegen/v2)/pkg/codegen/templates/strict/strict-http.tmpl\" > strict-http.gen.tmpl && grep -q decodeBody strict-http.gen.tmpl"
//go:generate go tool oapi-codegen -config server.cfg.yaml ../../api/openapi.yaml
