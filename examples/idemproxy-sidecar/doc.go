// SPDX-License-Identifier: Apache-2.0

// Package sidecar is an example of idemproxy as a sidecar
// (docker-compose.yaml): a Node.js payments service that charges on every
// POST, made idempotent with no code by idemproxy in its network
// namespace. Its test runs the same processes without Docker, with the
// compose file's settings, and checks that a retried payment charges once.
package sidecar
