// SPDX-License-Identifier: Apache-2.0

// Package handlers serves idemsvc's HTTP API (api/openapi.yaml) over a
// statemachine.Store.
//
// New builds the whole handler: the chi router generated from the spec with
// its strict server, implemented by Service, and around it the layers every
// request passes: a request id, an access log line and metrics; the API key
// and the tenant it acts for; the body's size, content type and JSON
// syntax. Request bodies decode strictly (see the api package); the store
// checks the contract's limits. Every error, whatever layer found it, is
// answered by writeProblem from one table of error kinds.
//
// A begin with wait_ms waits until its key's attempt is over. All waiters
// of one key share one poll of the key's status, so the store sees one read
// per waited key per poll interval, however many callers wait.
package handlers
