// SPDX-License-Identifier: Apache-2.0

package blob_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/idemsvc/idemsvc/internal/blob"
	"github.com/idemsvc/idemsvc/internal/testkit/s3test"
	"github.com/idemsvc/idemsvc/internal/testkit/testpki"
)

func open(t *testing.T, srv *s3test.Server) *blob.Store {
	t.Helper()
	srv.Setenv(t)
	st, err := blob.Open(context.Background(), blob.Config{URL: srv.URL("pfx"), TLS: srv.TLSConfig(), Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func random(t *testing.T, n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func put(t *testing.T, st *blob.Store, key string, body []byte) [32]byte {
	t.Helper()
	sum := sha256.Sum256(body)
	if err := st.Put(context.Background(), key, bytes.NewReader(body), int64(len(body)), sum); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return sum
}

func TestParseURL(t *testing.T) {
	for raw, want := range map[string][2]string{"s3://b": {"b", ""}, "s3://b/": {"b", ""}, "s3://b/p/q/": {"b", "p/q"}} {
		b, p, err := blob.ParseURL(raw)
		if err != nil || b != want[0] || p != want[1] {
			t.Errorf("%s: %q %q %v", raw, b, p, err)
		}
	}
	for _, raw := range []string{"", "http://b/p", "s3:///p", "s3://b/p?x=1", "s3://u:p@b/p"} {
		if _, _, err := blob.ParseURL(raw); err == nil {
			t.Errorf("%q accepted", raw)
		}
	}
}

func TestObjectKey(t *testing.T) {
	srv := s3test.New(t)
	st := open(t, srv)
	day := time.Date(2026, 11, 28, 13, 0, 0, 0, time.UTC)
	k := st.ObjectKey("acme", "order-{1}*", day, "0123456789abcdef0123456789abcdef")
	sum := sha256.Sum256([]byte("order-{1}*"))
	want := "pfx/acme/2026-11-28/" + hexs(sum[:]) + "/0123456789abcdef0123456789abcdef"
	if k != want {
		t.Fatalf("object key %s, want %s", k, want)
	}
	// The record expires at now + retention at the latest: its day ends
	// after that.
	now := time.Date(2026, 11, 27, 23, 59, 0, 0, time.UTC)
	if d := blob.ExpiryDay(now, 24*time.Hour); !d.Add(24 * time.Hour).After(now.Add(24*time.Hour + time.Hour)) {
		t.Fatalf("expiry day %v ends before the record expires", d)
	}
}

func hexs(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

func readAll(t *testing.T, st *blob.Store, key string, size int64, sum [32]byte) ([]byte, error) {
	t.Helper()
	r, err := st.Get(context.Background(), key, size, sum)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

func TestRoundTrip(t *testing.T) {
	st := open(t, s3test.New(t))
	for _, n := range []int{0, 1, 1 << 10, 1<<20 + 3} {
		body := random(t, n)
		key := "pfx/t/2030-01-01/h/" + time.Now().Format("150405.000000000")
		sum := put(t, st, key, body)
		got, err := readAll(t, st, key, int64(n), sum)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("%d bytes: got %d bytes, %v", n, len(got), err)
		}
		// A retried put of the same bytes is not an error; other bytes are.
		put(t, st, key, body)
		other := append(random(t, 1), body...)
		if err := st.Put(context.Background(), key, bytes.NewReader(other), int64(len(other)), sha256.Sum256(other)); !errors.Is(err, blob.ErrExists) {
			t.Fatalf("put of other bytes under a taken key: %v", err)
		}
		if err := st.Delete(context.Background(), key); err != nil {
			t.Fatal(err)
		}
		if _, err := readAll(t, st, key, int64(n), sum); !errors.Is(err, blob.ErrMissing) {
			t.Fatalf("deleted object: %v", err)
		}
		if err := st.Delete(context.Background(), key); err != nil {
			t.Fatalf("delete of an absent object: %v", err)
		}
	}
}

// A put whose bytes do not match its SHA-256 is refused by the store and
// leaves no object.
func TestPutWrongChecksum(t *testing.T) {
	srv := s3test.New(t)
	st := open(t, srv)
	body := random(t, 4096)
	sum := sha256.Sum256(body)
	body[0] ^= 1
	if err := st.Put(context.Background(), "pfx/a/2030-01-01/h/t", bytes.NewReader(body), int64(len(body)), sum); err == nil {
		t.Fatal("a put with a wrong checksum was accepted")
	}
	if _, err := srv.Client().HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String(s3test.Bucket), Key: aws.String("pfx/a/2030-01-01/h/t")}); err == nil {
		t.Fatal("a put with a wrong checksum left an object")
	}
}

func TestGetMissingAndCorrupt(t *testing.T) {
	srv := s3test.New(t)
	st := open(t, srv)
	if _, err := readAll(t, st, "pfx/a/2030-01-01/h/none", 3, [32]byte{}); !errors.Is(err, blob.ErrMissing) {
		t.Fatalf("missing object: %v", err)
	}
	body := random(t, 256<<10)
	key := "pfx/a/2030-01-01/h/c"
	sum := put(t, st, key, body)
	// A reference whose SHA-256 is not the object's: refused before a byte.
	wrong := sum
	wrong[0] ^= 1
	if _, err := st.Get(context.Background(), key, int64(len(body)), wrong); !errors.Is(err, blob.ErrCorrupt) {
		t.Fatalf("wrong reference: %v", err)
	}
	if _, err := st.Get(context.Background(), key, int64(len(body))+1, sum); !errors.Is(err, blob.ErrCorrupt) {
		t.Fatalf("wrong size: %v", err)
	}
	// The object's bytes changed below the store's API (a disk fault): the
	// stored checksum still matches, so only the stream can tell; it is
	// cut off before its last byte.
	path := srv.ObjectPath(key)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readAll(t, st, key, int64(len(body)), sum)
	if !errors.Is(err, blob.ErrCorrupt) {
		t.Fatalf("corrupt object read with %v", err)
	}
	if len(got) >= len(body) {
		t.Fatalf("a corrupt object was delivered whole (%d bytes)", len(got))
	}
}

func TestSweep(t *testing.T) {
	st := open(t, s3test.New(t))
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	keep := []string{
		st.ObjectKey("a", "k1", now, "t1"),                      // today: its records may live to its end
		st.ObjectKey("a", "k2", now.Add(48*time.Hour), "t2"),    // later
		st.ObjectKey("b", "k3", now.Add(30*24*time.Hour), "t3"), // much later
	}
	gone := []string{
		st.ObjectKey("a", "k4", now.Add(-24*time.Hour), "t4"),
		st.ObjectKey("b", "k5", now.Add(-24*time.Hour), "t5"),
		st.ObjectKey("b", "k6", now.Add(-40*24*time.Hour), "t6"),
	}
	sums := map[string][32]byte{}
	for _, k := range append(append([]string{}, keep...), gone...) {
		sums[k] = put(t, st, k, []byte(k))
	}
	n, err := st.Sweep(context.Background(), now)
	if err != nil || n != len(gone) {
		t.Fatalf("sweep removed %d, %v; want %d", n, err, len(gone))
	}
	for _, k := range keep {
		if _, err := readAll(t, st, k, int64(len(k)), sums[k]); err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}
	for _, k := range gone {
		if _, err := readAll(t, st, k, int64(len(k)), sums[k]); !errors.Is(err, blob.ErrMissing) {
			t.Errorf("%s swept: %v", k, err)
		}
	}
}

func TestStoreDown(t *testing.T) {
	srv := s3test.New(t)
	st := open(t, srv)
	srv.Stop(t)
	body := []byte("x")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := st.Put(ctx, "pfx/a/2030-01-01/h/d", bytes.NewReader(body), 1, sha256.Sum256(body)); !errors.Is(err, blob.ErrUnavailable) {
		t.Fatalf("put with the store down: %v", err)
	}
	if err := st.Ping(ctx); !errors.Is(err, blob.ErrUnavailable) {
		t.Fatalf("ping with the store down: %v", err)
	}
	srv.Start(t)
	put(t, st, "pfx/a/2030-01-01/h/d", body)
}

func TestTLSPrivateCA(t *testing.T) {
	ca := testpki.NewCA(t, "blob-ca")
	srv := s3test.NewTLS(t, ca)
	st := open(t, srv)
	sum := put(t, st, "pfx/a/2030-01-01/h/tls", []byte("over TLS"))
	if got, err := readAll(t, st, "pfx/a/2030-01-01/h/tls", 8, sum); err != nil || string(got) != "over TLS" {
		t.Fatalf("%q %v", got, err)
	}
	// Without the CA the store's certificate is refused.
	plain, err := blob.Open(context.Background(), blob.Config{URL: srv.URL("pfx"), Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Ping(context.Background()); err == nil {
		t.Fatal("a certificate of an unknown CA was accepted")
	}
}
