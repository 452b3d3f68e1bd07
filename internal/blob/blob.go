// SPDX-License-Identifier: Apache-2.0

// Package blob keeps large stored response bodies in an S3-compatible
// store, by reference from their records (IDEMSVC_BLOB_URL).
//
// An object's key is <prefix>/<tenant>/<expiry day>/<hash of the record
// key>/<lease token>: the same for every try of one attempt's complete, so
// that a retried upload finds its own object (it is written only if
// absent, If-None-Match: *), under the tenant's prefix, with the record key
// only as a hash, and grouped by the day after which its record has
// expired, which is what the sweeper removes by.
//
// It uses the AWS SDK for Go v2 rather than hand-written requests: request
// signing, the standard AWS configuration (variables, shared files,
// credential providers) and retries are the SDK's job.
package blob

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// Errors of the store, for errors.Is.
var (
	// ErrMissing is an object that is not in the store.
	ErrMissing = errors.New("blob: object missing")
	// ErrCorrupt is an object whose bytes are not those its reference
	// names (size or SHA-256).
	ErrCorrupt = errors.New("blob: object does not match its SHA-256")
	// ErrUnavailable is a store that could not be reached or refused the
	// call.
	ErrUnavailable = errors.New("blob: store unavailable")
	// ErrExists is a put whose key holds another object already.
	ErrExists = errors.New("blob: another object exists under the key")
)

// Config configures a Store.
type Config struct {
	// URL is s3://bucket[/prefix].
	URL string
	// TLS, when set, is the TLS configuration of HTTPS endpoints (a
	// private CA); nil uses the system's roots.
	TLS *tls.Config
	// Timeout bounds each call but the body's transfer (default 10 s).
	Timeout time.Duration
}

// Store is an S3-compatible bucket and a prefix in it.
type Store struct {
	client  *s3.Client
	bucket  string
	prefix  string // "" or ending in "/"
	timeout time.Duration
}

// ParseURL splits s3://bucket/prefix into its bucket and prefix (without
// slashes at either end).
func ParseURL(raw string) (bucket, prefix string, err error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "s3" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", "", fmt.Errorf("blob: %q is not s3://bucket[/prefix]", raw)
	}
	return u.Host, strings.Trim(u.Path, "/"), nil
}

// Open configures a store from cfg and the standard AWS configuration:
// AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY and the shared config and credential files. A
// custom endpoint is addressed path-style. It does not call the store.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	bucket, prefix, err := ParseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	opts := []func(*config.LoadOptions) error{
		// Since 2025 the SDK sends CRC32 checksums by default, which many
		// S3-compatible stores refuse; idemsvc sends its own SHA-256.
		config.WithRequestChecksumCalculation(aws.RequestChecksumCalculationWhenRequired),
		config.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired),
	}
	if cfg.TLS != nil {
		opts = append(opts, config.WithHTTPClient(awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
			tr.TLSClientConfig = cfg.TLS.Clone()
		})))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("blob: the AWS configuration: %w", err)
	}
	if awsCfg.Region == "" {
		awsCfg.Region = "us-east-1" // S3-compatible stores ignore it; signing needs one
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		// A custom endpoint (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the
		// config file's endpoint_url) is an S3-compatible store, which
		// knows buckets by path rather than by host name.
		if awsCfg.BaseEndpoint != nil || o.BaseEndpoint != nil {
			o.UsePathStyle = true
		}
	})
	if prefix != "" {
		prefix += "/"
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	return &Store{client: client, bucket: bucket, prefix: prefix, timeout: timeout}, nil
}

// Bucket is the store's bucket.
func (s *Store) Bucket() string { return s.bucket }

// dayFormat names an expiry day in object keys: sorted as text, in time
// order.
const dayFormat = "2006-01-02"

// ObjectKey is the key of the object of one attempt: tenant, the UTC day
// after whose end its record has expired, the SHA-256 of the record key,
// and the attempt's lease token.
func (s *Store) ObjectKey(tenant, key string, expiryDay time.Time, token string) string {
	sum := sha256.Sum256([]byte(key))
	return s.prefix + tenant + "/" + expiryDay.UTC().Format(dayFormat) + "/" + hex.EncodeToString(sum[:]) + "/" + token
}

// ExpiryDay is the day an object written now for a record kept retention
// goes under: a day after the record's expiry at the latest, so that the
// sweeper, which removes the objects of days that have ended, never takes
// one whose record may still be there (the margin covers the upload's
// time and the clocks of idemsvc and Redis differing).
func ExpiryDay(now time.Time, retention time.Duration) time.Time {
	return now.UTC().Add(retention + 24*time.Hour).Truncate(24 * time.Hour)
}

// Put writes body (size bytes whose SHA-256 is sum, seekable so that the
// SDK can sign and resend it) under key, only if the key is free. A key
// that holds the same bytes already (a retried put) is not an error; one
// that holds others is ErrExists.
func (s *Store) Put(ctx context.Context, key string, body io.ReadSeeker, size int64, sum [32]byte) error {
	_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:         &s.bucket,
		Key:            &key,
		Body:           body,
		ContentLength:  aws.Int64(size),
		ContentType:    aws.String("application/octet-stream"),
		ChecksumSHA256: aws.String(base64.StdEncoding.EncodeToString(sum[:])),
		IfNoneMatch:    aws.String("*"),
	})
	if err == nil {
		return nil
	}
	// PreconditionFailed: the key is taken. No answer at all (no API
	// code): the store may have refused the put at its headers and reset
	// the connection before reading a large body (as a retried put of the
	// same object is refused), or may have stored it. The object's head
	// tells which; without one, the put's own error stands.
	code := apiCode(err)
	if code != "PreconditionFailed" && code != "" {
		return classify("put", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	head, herr := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: &key, ChecksumMode: types.ChecksumModeEnabled})
	if herr != nil {
		if code == "" {
			return classify("put", err)
		}
		return classify("head", herr)
	}
	if aws.ToInt64(head.ContentLength) == size && aws.ToString(head.ChecksumSHA256) == base64.StdEncoding.EncodeToString(sum[:]) {
		return nil
	}
	return fmt.Errorf("blob: put %s: %w", key, ErrExists)
}

// Get opens the object under key for reading, checked against its size
// and SHA-256: a stored checksum that differs fails at once
// (ErrCorrupt), and the reader withholds the object's last byte until
// every byte has been read and matched, so that a wrong object is cut
// off before its end (its Read fails with ErrCorrupt) rather than
// delivered whole.
func (s *Store) Get(ctx context.Context, key string, size int64, sum [32]byte) (io.ReadCloser, error) {
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: &key, ChecksumMode: types.ChecksumModeEnabled})
	if err != nil {
		return nil, classify("get", err)
	}
	if (out.ContentLength != nil && *out.ContentLength != size) ||
		(out.ChecksumSHA256 != nil && *out.ChecksumSHA256 != base64.StdEncoding.EncodeToString(sum[:])) {
		out.Body.Close()
		return nil, fmt.Errorf("blob: get %s: %w", key, ErrCorrupt)
	}
	return &verifier{body: out.Body, left: size, want: sum, hash: sha256.New()}, nil
}

// verifier reads an object, counting and hashing it, and keeps its last
// byte back until the whole object matched.
type verifier struct {
	body io.ReadCloser
	left int64 // bytes not yet read from body
	want [32]byte
	hash hash.Hash
	last byte // the withheld last byte, while hold
	hold bool
	done bool // the object matched
	err  error
}

func (v *verifier) Read(p []byte) (int, error) {
	switch {
	case v.err != nil:
		return 0, v.err
	case v.done && v.hold:
		if len(p) == 0 {
			return 0, nil
		}
		p[0], v.hold = v.last, false
		return 1, nil
	case v.done:
		return 0, io.EOF
	case v.left == 0: // all read (the last byte held back), or an empty object
		if v.err = v.check(); v.err != nil {
			return 0, v.err
		}
		v.done = true
		return v.Read(p)
	}
	if int64(len(p)) > v.left {
		p = p[:v.left]
	}
	n, err := v.body.Read(p)
	v.hash.Write(p[:n])
	v.left -= int64(n)
	if v.left == 0 && n > 0 {
		v.last, v.hold = p[n-1], true
		n--
	}
	switch {
	case v.left == 0:
		// Whole: the check decides (the SDK's own checksum check, when
		// the store sent one, fails the last read of a wrong object).
	case err == io.EOF:
		v.err = fmt.Errorf("blob: object shorter than its reference: %w", ErrCorrupt)
	case err != nil && err != io.EOF:
		v.err = fmt.Errorf("blob: reading an object: %w", errors.Join(ErrUnavailable, err))
	}
	if n == 0 && v.err != nil {
		return 0, v.err
	}
	return n, nil
}

// check makes sure that the object ends where its reference says and
// matches its SHA-256.
func (v *verifier) check() error {
	var extra [1]byte
	if n, _ := io.ReadFull(v.body, extra[:]); n > 0 {
		return fmt.Errorf("blob: object longer than its reference: %w", ErrCorrupt)
	}
	var got [32]byte
	v.hash.Sum(got[:0])
	if got != v.want {
		return fmt.Errorf("blob: %w", ErrCorrupt)
	}
	return nil
}

func (v *verifier) Close() error { return v.body.Close() }

// Delete removes the object under key; an absent one is not an error.
func (s *Store) Delete(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: &key}); err != nil {
		if errors.Is(classify("delete", err), ErrMissing) {
			return nil
		}
		return classify("delete", err)
	}
	return nil
}

// Ping reports whether the bucket can be reached.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if _, err := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &s.bucket}); err != nil {
		return classify("head bucket", err)
	}
	return nil
}

// apiCode is the S3 error code of err, or "".
func apiCode(err error) string {
	var api smithy.APIError
	if errors.As(err, &api) {
		return api.ErrorCode()
	}
	return ""
}

// classify wraps an SDK error as ErrMissing or ErrUnavailable.
func classify(op string, err error) error {
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	if errors.As(err, &nsk) || errors.As(err, &nf) || apiCode(err) == "NoSuchKey" || apiCode(err) == "NotFound" {
		return fmt.Errorf("blob: %s: %w", op, ErrMissing)
	}
	if apiCode(err) == "BadDigest" || apiCode(err) == "XAmzContentSHA256Mismatch" {
		return fmt.Errorf("blob: %s: %w", op, errors.Join(ErrCorrupt, err))
	}
	return fmt.Errorf("blob: %s: %w", op, errors.Join(ErrUnavailable, err))
}
