// Package idem is the Go client of idemsvc, the idempotency service.
//
// ClientWithResponses, generated from api/openapi.yaml, makes each API call
// and parses its answer into the typed models of this package.
package idem
