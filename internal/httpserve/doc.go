// SPDX-License-Identifier: Apache-2.0

// Package httpserve is the HTTP edge shared by idemsvc and idemproxy: one
// listener and server with the same timeouts, a connection cap that closes
// idle connections before it refuses new ones (and then refuses them at
// once), problem details for the errors net/http answers itself,
// rate-limited logging of failed TLS handshakes, connections closed after
// a request with a Transfer-Encoding, and a budget for the request bodies
// held in memory at once.
package httpserve
