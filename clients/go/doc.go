// SPDX-License-Identifier: Apache-2.0

// Package idem is the Go client of idemsvc, the idempotency service: it
// makes an operation run at most once per idempotency key and replays the
// stored result to every duplicate.
//
// New returns a Client; its options (WithAPIKey, WithTLSFiles, WithTenant,
// WithRetryBudget...) are the only configuration. Every call is retried on
// network errors, 503 and 429 answers within the retry budget, which is
// safe: a begin carries an owner, and complete and fail carry the lease
// token.
//
// Three ways to use it, from the most to the least automatic:
//
//   - Middleware makes an HTTP handler idempotent per the Idempotency-Key
//     header draft: a retried POST gets the stored answer.
//   - Client.Do runs a function at most once per key, for message
//     consumers and jobs, extending the lease while it runs.
//   - Client.Begin, Complete, Fail, Extend, Status, Keys and Delete are
//     the API's calls, for callers that manage the steps themselves.
//
// Without WithHTTP, calls go over the package's own HTTP/1.1 transport:
// each call is made on the caller's goroutine, over a pool of keep-alive
// connections, and the calls of an operation (begin, complete, fail,
// extend) are written without building an http.Request. That costs a
// calling service about 40% less CPU per call than http.Transport. Calls
// go through net/http instead when the environment names a proxy for
// idemsvc.
//
// Errors are *Error values carrying the API's problem details; match them
// with errors.Is against ErrInProgress, ErrLeaseLost, ErrUnavailable and
// the other kinds.
//
// The module requires the standard library and the oapi-codegen runtime
// only:
//
//	go get github.com/idemsvc/idemsvc/clients/go@latest
//
// The models and the lower-level APIClient are generated from the API's
// OpenAPI description (api/openapi.yaml in the repository).
package idem
