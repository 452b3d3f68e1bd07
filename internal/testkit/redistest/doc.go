// SPDX-License-Identifier: Apache-2.0

// Package redistest gives tests real Redis servers: standalone servers,
// Redis Clusters of three masters with one replica each, and Sentinel
// setups of a master, a replica and three Sentinels. NewClusterWith and
// NewSentinelWith give more replicas, for tests whose failovers must leave
// the promoted replica a replica of its own.
//
// Servers come from the first source that is available:
//
//  1. Existing servers named by the environment: IDEMSVC_TEST_REDIS_ADDR
//     (host:port of a standalone server) and IDEMSVC_TEST_REDIS_CLUSTER_ADDRS
//     (comma-separated seed nodes of a cluster). Each variable applies to its
//     own kind of server only. Operations that need control over the process
//     (Stop, Kill, Start, Restart, Pause) skip the calling test in this mode,
//     and NewServer and NewCluster return the external servers rather than
//     dedicated ones. A cluster named by seeds is discovered whole. Tests
//     that change a server's configuration or count its commands use
//     NewPrivateServer or ClusterOptions.Private, which start servers of
//     their own in this mode too.
//  2. redis-server processes started from the binary found on PATH, bound to
//     free ports on 127.0.0.1, without persistence, in temporary directories.
//  3. redis:7.0 containers started through testcontainers-go when there is no
//     redis-server binary but a Docker engine answers. Containers use host
//     networking so cluster nodes announce 127.0.0.1 addresses.
//
// When none is available the test fails with instructions; it is never
// skipped silently.
//
// NewSentinel always starts local redis-server processes (the Sentinels
// with --sentinel and a configuration file each), also when the
// environment names external servers, and so do the secured topologies
// (NewSecurity). Where only Docker is available, their tests are skipped,
// saying that they need the redis-server binary.
//
// NewServer, NewCluster and NewSentinel start servers dedicated to one test
// and stop them when the test ends. SharedServer and SharedCluster start one
// instance per test binary, lazily on first use, for tests that only read
// and write: such tests must use unique keys, and the shared instances
// refuse Stop, Kill, Start, Restart and Pause. A package that uses
// SharedServer or SharedCluster must call Main from its TestMain so the
// shared instances are stopped:
//
//	func TestMain(m *testing.M) { redistest.Main(m) }
//
// Processes are started in their own process group and are killed by the
// kernel if the test binary dies, so an interrupted run leaves no servers
// behind.
package redistest
