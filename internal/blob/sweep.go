// SPDX-License-Identifier: Apache-2.0

package blob

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// Sweep removes the objects of every expiry day that ended before now:
// their records have expired (ExpiryDay), so nothing a record still
// names is taken. It lists with ListObjectsV2 (tenants, then their days,
// by delimiter) and deletes with DeleteObjects, a thousand keys a call,
// and returns how many objects it removed.
func (s *Store) Sweep(ctx context.Context, now time.Time) (int, error) {
	today := now.UTC().Format(dayFormat)
	tenants, err := s.children(ctx, s.prefix)
	if err != nil {
		return 0, err
	}
	removed := 0
	for _, tenant := range tenants {
		days, err := s.children(ctx, tenant)
		if err != nil {
			return removed, err
		}
		for _, day := range days {
			name := strings.TrimSuffix(strings.TrimPrefix(day, tenant), "/")
			if _, perr := time.Parse(dayFormat, name); perr != nil || name >= today {
				continue // not a day of idemsvc's, or one not yet over
			}
			n, err := s.deleteUnder(ctx, day)
			removed += n
			if err != nil {
				return removed, err
			}
		}
	}
	return removed, nil
}

// children lists the "directories" right under prefix (each ending in /).
func (s *Store) children(ctx context.Context, prefix string) ([]string, error) {
	var out []string
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: &prefix, Delimiter: aws.String("/")})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return out, classify("list", err)
		}
		for _, cp := range page.CommonPrefixes {
			out = append(out, aws.ToString(cp.Prefix))
		}
	}
	return out, nil
}

// deleteUnder removes every object whose key starts with prefix.
func (s *Store) deleteUnder(ctx context.Context, prefix string) (int, error) {
	removed := 0
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: &prefix, MaxKeys: aws.Int32(1000)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return removed, classify("list", err)
		}
		if len(page.Contents) == 0 {
			continue
		}
		ids := make([]types.ObjectIdentifier, len(page.Contents))
		for i, o := range page.Contents {
			ids[i] = types.ObjectIdentifier{Key: o.Key}
		}
		out, err := s.client.DeleteObjects(ctx, &s3.DeleteObjectsInput{
			Bucket: &s.bucket,
			Delete: &types.Delete{Objects: ids, Quiet: aws.Bool(true)},
			// DeleteObjects must carry a checksum; SHA-256, which
			// S3-compatible stores know, rather than the SDK's CRC32.
			ChecksumAlgorithm: types.ChecksumAlgorithmSha256,
		})
		if err != nil {
			return removed, classify("delete objects", err)
		}
		removed += len(ids) - len(out.Errors)
		if len(out.Errors) > 0 {
			return removed, fmt.Errorf("blob: delete objects: %d not deleted, first %s: %w", len(out.Errors), aws.ToString(out.Errors[0].Code), ErrUnavailable)
		}
	}
	return removed, nil
}

// Sweeper runs Sweep every interval until ctx ends, reporting each run
// to report (its count and error).
func (s *Store) Sweeper(ctx context.Context, interval time.Duration, report func(int, error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		n, err := s.Sweep(ctx, time.Now())
		report(n, err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// DeleteAttempts removes the objects of the record key's attempts other
// than keep's (every one when keep is ""), written before before: those
// of attempts taken over or of a deleted record, which no complete can
// name any more. It lists the tenant's days, then the key's objects in
// each.
func (s *Store) DeleteAttempts(ctx context.Context, tenant, key, keep string, before time.Time) (int, error) {
	days, err := s.children(ctx, s.prefix+tenant+"/")
	if err != nil {
		return 0, err
	}
	sum := sha256.Sum256([]byte(key))
	hash := hex.EncodeToString(sum[:])
	removed := 0
	for _, day := range days {
		prefix := day + hash + "/"
		p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: &prefix})
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				return removed, classify("list", err)
			}
			for _, o := range page.Contents {
				k := aws.ToString(o.Key)
				if (keep != "" && strings.HasSuffix(k, "/"+keep)) || o.LastModified == nil || !o.LastModified.Before(before) {
					continue
				}
				if err := s.Delete(ctx, k); err != nil {
					return removed, err
				}
				removed++
			}
		}
	}
	return removed, nil
}
