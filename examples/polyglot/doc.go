// SPDX-License-Identifier: Apache-2.0

// Package polyglot holds scripts that call idemsvc over plain HTTP, without
// the Go SDK: begin-complete-replay.sh (POSIX sh, curl and sed) and
// begin-complete-replay.mjs (Node.js, built-in fetch). Its test runs them
// against an in-process idemsvc.
package polyglot
