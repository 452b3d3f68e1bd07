// SPDX-License-Identifier: Apache-2.0

// Package robustness checks idemsvc's promise under faults, in the manner
// of etcd's robustness tests: real Redis topologies (standalone with and
// without an fsynced append-only file, Sentinel, a 3+3 Cluster) started by
// internal/testkit/redistest, three idemsvc processes of the real binary in front
// of each, traffic through the HTTP API that records every call with its
// call and return times and its answer, failpoints (kill -9 and SIGSTOP of
// masters, replicas and idemsvc processes, CLUSTER FAILOVER, a stale
// replica promoted after its master dies, Redis restarts, and latency,
// resets and black holes on the link to a standalone Redis through an
// embedded toxiproxy), and then checkers over the history:
//
//   - linearizability of each key against a model of the record, with
//     porcupine; lease expiry is part of the model, through the Redis
//     times the answers carry;
//   - invariants: no acknowledged outcome lost, at most one attempt of a
//     key acknowledged as finished, strictly increasing attempts, no 200
//     for a superseded token, no 500;
//   - availability: for each fault, the time until every key it disturbed
//     got a definite answer again (a measurement, not a pass/fail check).
//
// TestRobustness runs the Cluster with WAIT 1 for about a minute (part of
// make test). With ROBUSTNESS_DURATION set (make robustness), it runs
// every scenario, sharing that time between them.
package robustness
