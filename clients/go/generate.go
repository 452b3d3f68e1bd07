// SPDX-License-Identifier: Apache-2.0

package idem

// The generator is a tool of idemsvc's own module, so that this module
// requires only what the client needs at run time. The service generates
// the same models for itself: internal/api/generate.go says why they are
// not shared, and a test of the service keeps the two copies identical.
//go:generate go -C ../.. tool oapi-codegen -config clients/go/client.cfg.yaml api/openapi.yaml
