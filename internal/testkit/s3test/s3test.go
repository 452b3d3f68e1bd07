// SPDX-License-Identifier: Apache-2.0

// Package s3test gives tests a real S3-compatible store: versitygw with
// its posix backend, started on a free loopback port over a temporary
// directory, with root credentials and one bucket, and stopped by its PID
// when the test ends. scripts/test.sh (make test) installs versitygw and
// names it in IDEMSVC_TEST_VERSITYGW; without it the test fails saying
// so, never skips.
package s3test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/idemsvc/idemsvc/internal/testkit/redistest"
	"github.com/idemsvc/idemsvc/internal/testkit/testpki"
)

// Version is the versitygw release scripts/test.sh installs.
const Version = "v1.8.0"

// The root credentials and region of every server.
const (
	AccessKey = "idemsvc-test"
	SecretKey = "idemsvc-test-secret"
	Region    = "us-east-1"
	Bucket    = "idemsvc"
)

// Server is one versitygw process.
type Server struct {
	bin    string
	dir    string // the posix backend's root: a directory per bucket
	port   int
	scheme string
	args   []string
	tls    *tls.Config // a client's, for a TLS server

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// Binary finds versitygw: IDEMSVC_TEST_VERSITYGW, PATH, or the cache
// directory scripts/test.sh builds it in.
func Binary() (string, error) {
	if p := os.Getenv("IDEMSVC_TEST_VERSITYGW"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	p := filepath.Join(cache, "idemsvc-tools", "versitygw-"+Version, "versitygw")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("versitygw %s not found: run make test (scripts/test.sh installs it), or go install github.com/versity/versitygw/cmd/versitygw@%s and set IDEMSVC_TEST_VERSITYGW", Version, Version)
}

// New starts a plain-HTTP server with Bucket in it.
func New(tb testing.TB) *Server { return start(tb, nil) }

// NewTLS starts a server that serves HTTPS with a certificate of ca for
// 127.0.0.1; TLSConfig is a client's configuration that trusts ca.
func NewTLS(tb testing.TB, ca *testpki.CA) *Server { return start(tb, ca) }

func start(tb testing.TB, ca *testpki.CA) *Server {
	tb.Helper()
	bin, err := Binary()
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	s := &Server{bin: bin, dir: filepath.Join(dir, "data"), scheme: "http", log: filepath.Join(dir, "versitygw.log")}
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	var extra []string
	if ca != nil {
		cert, key := ca.Issue(tb, "versitygw", "127.0.0.1").Write(tb, dir, "versitygw")
		extra = []string{"--cert", cert, "--key", key}
		s.scheme = "https"
		s.tls = &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	}
	for attempt := 0; ; attempt++ {
		s.port, err = freePort()
		if err != nil {
			tb.Fatal(err)
		}
		s.args = append([]string{"--access", AccessKey, "--secret", SecretKey, "--region", Region,
			"--port", "127.0.0.1:" + strconv.Itoa(s.port), "--quiet"}, extra...)
		s.args = append(s.args, "posix", s.dir)
		if err = s.launch(); err == nil {
			break
		}
		s.Stop(tb)
		if attempt == 2 {
			tb.Fatalf("start versitygw: %v\n%s", err, s.logTail())
		}
	}
	tb.Cleanup(func() { s.Stop(tb) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(Bucket)}); err != nil {
		tb.Fatalf("create bucket: %v", err)
	}
	return s
}

// freePort asks the kernel for a free port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// launch starts the process and waits until it accepts connections.
func (s *Server) launch() error {
	out, err := os.OpenFile(s.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := redistest.StartChild(cmd); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return errors.New("versitygw exited")
		default:
		}
		if c, err := net.DialTimeout("tcp", s.Addr(), 200*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("versitygw did not listen within 10 s")
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Stop ends the process (SIGTERM, then SIGKILL), by its PID; the data
// stays for Start. Stopping a stopped server does nothing.
func (s *Server) Stop(tb testing.TB) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Start starts a stopped server again, on the same port and data.
func (s *Server) Start(tb testing.TB) {
	tb.Helper()
	var err error
	for range 50 { // the port may linger briefly after the stop
		if err = s.launch(); err == nil {
			return
		}
		s.Stop(tb)
		time.Sleep(100 * time.Millisecond)
	}
	tb.Fatalf("restart versitygw: %v\n%s", err, s.logTail())
}

// Addr is host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Endpoint is the server's URL, for AWS_ENDPOINT_URL_S3.
func (s *Server) Endpoint() string { return s.scheme + "://" + s.Addr() }

// URL is the IDEMSVC_BLOB_URL of prefix in Bucket.
func (s *Server) URL(prefix string) string { return "s3://" + Bucket + "/" + prefix }

// TLSConfig is a client's TLS configuration for a TLS server, else nil.
func (s *Server) TLSConfig() *tls.Config { return s.tls }

// Env is the standard AWS variables that point a client at the server.
func (s *Server) Env() []string {
	return []string{
		"AWS_ENDPOINT_URL_S3=" + s.Endpoint(),
		"AWS_ACCESS_KEY_ID=" + AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + SecretKey,
		"AWS_REGION=" + Region,
		"AWS_CA_BUNDLE=", // TLSConfig, not this machine's bundle
		// No shared files of this machine's user.
		"AWS_CONFIG_FILE=" + os.DevNull,
		"AWS_SHARED_CREDENTIALS_FILE=" + os.DevNull,
	}
}

// Setenv sets Env in the test's environment (so not in parallel tests).
func (s *Server) Setenv(tb testing.TB) {
	for _, kv := range s.Env() {
		for i := range kv {
			if kv[i] == '=' {
				tb.Setenv(kv[:i], kv[i+1:])
				break
			}
		}
	}
}

// Client is an S3 client of the server, to look at and tamper with
// objects behind idemsvc's back.
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{
		Region:                     Region,
		BaseEndpoint:               aws.String(s.Endpoint()),
		UsePathStyle:               true,
		Credentials:                credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
		HTTPClient:                 httpClient(s.tls),
	})
}

// ObjectPath is the file that holds an object in the posix backend, to
// corrupt it below the S3 API.
func (s *Server) ObjectPath(key string) string {
	return filepath.Join(s.dir, Bucket, filepath.FromSlash(key))
}

func httpClient(c *tls.Config) s3.HTTPClient {
	if c == nil {
		return nil
	}
	tr := &http.Transport{TLSClientConfig: c}
	return &http.Client{Transport: tr}
}
