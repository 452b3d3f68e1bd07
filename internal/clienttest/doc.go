// SPDX-License-Identifier: Apache-2.0

// Package clienttest tests the Go client (clients/go, a module of its
// own) end to end against a real idemsvc served in process. The tests live
// here, in idemsvc's module, so that the client's module requires nothing
// but what the client needs at run time.
package clienttest
