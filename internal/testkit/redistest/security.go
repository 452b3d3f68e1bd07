// SPDX-License-Identifier: Apache-2.0

package redistest

import (
	"crypto/rand"
	"crypto/tls"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/testkit/testpki"
)

// Security makes a topology's servers speak TLS only, require a client
// certificate that CA signed, and admit only the ACL user Username: the
// default user is off on Redis servers (Sentinels keep it for each other,
// and know Username too). Replicas, Cluster buses and Sentinels reach the
// servers over TLS as Username as well.
type Security struct {
	Username, Password string
	// CAFile signs every certificate; CertFile and KeyFile are the
	// servers' certificate, and ClientCertFile and ClientKeyFile one for
	// the clients under test. All are PEM files.
	CAFile, CertFile, KeyFile     string
	ClientCertFile, ClientKeyFile string

	tls *tls.Config
}

// NewSecurity makes a CA and the certificates it signs in a temporary
// directory of tb, and an ACL user with a random password.
func NewSecurity(tb testing.TB) *Security {
	tb.Helper()
	dir := tb.TempDir()
	ca := testpki.NewCA(tb, "redistest CA")
	server, client := ca.Issue(tb, "redis"), ca.Issue(tb, "client")
	s := &Security{Username: "idem", Password: rand.Text(), CAFile: ca.Write(tb, dir, "ca")}
	s.CertFile, s.KeyFile = server.Write(tb, dir, "redis")
	s.ClientCertFile, s.ClientKeyFile = client.Write(tb, dir, "client")
	s.tls = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.Pool(), Certificates: []tls.Certificate{client.TLS(tb)}}
	return s
}

// TLSConfig returns the clients' TLS configuration: the CA as the only
// root, and the client certificate.
func (s *Security) TLSConfig() *tls.Config { return s.tls.Clone() }

// serverArgs are the arguments that secure a redis-server listening on
// port; they replace its --port.
func (s *Security) serverArgs(port int, cluster bool) []string {
	args := []string{
		"--port", "0",
		"--tls-port", strconv.Itoa(port),
		"--tls-cert-file", s.CertFile,
		"--tls-key-file", s.KeyFile,
		"--tls-ca-cert-file", s.CAFile,
		"--tls-replication", "yes",
		"--user", "default", "off",
		"--user", s.Username, "on", ">" + s.Password, "~*", "&*", "+@all",
		"--masteruser", s.Username,
		"--masterauth", s.Password,
	}
	if cluster {
		args = append(args, "--tls-cluster", "yes")
	}
	return args
}

// sentinelListen is the Sentinel configuration that serves TLS only on
// port and reaches servers over TLS.
func (s *Security) sentinelListen(port int) string {
	return "port 0\ntls-port " + strconv.Itoa(port) + "\n" +
		"tls-cert-file " + strconv.Quote(s.CertFile) + "\ntls-key-file " + strconv.Quote(s.KeyFile) + "\n" +
		"tls-ca-cert-file " + strconv.Quote(s.CAFile) + "\ntls-replication yes\n" +
		"user " + s.Username + " on >" + s.Password + " ~* &* +@all\n"
}

// sentinelAuth is the Sentinel configuration that reaches the servers of
// master as Username; it follows master's monitor line.
func (s *Security) sentinelAuth(master string) string {
	return "sentinel auth-user " + master + " " + s.Username + "\n" +
		"sentinel auth-pass " + master + " " + s.Password + "\n"
}

// secured maps the address of every secured server the harness runs to
// its Security, so that the harness's own clients of a server (health
// checks, setup) speak to it as it requires.
var secured sync.Map

// secure adds what the server at o.Addr requires, if anything, to o.
func secure(o *redis.Options) *redis.Options {
	if v, ok := secured.Load(o.Addr); ok {
		s := v.(*Security)
		o.TLSConfig, o.Username, o.Password = s.TLSConfig(), s.Username, s.Password
	}
	return o
}
