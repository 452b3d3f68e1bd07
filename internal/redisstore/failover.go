// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Following a failover.
//
// go-redis's ClusterClient learns a new slot map only from a MOVED or ASK
// reply, or every ClusterStateReloadInterval (60 s): a master that was
// killed (connections refused) or hangs (reads time out) answers neither,
// so calls for its slots kept going to it long after a replica took over.
// A FailoverClient asks Sentinel for the master on every new connection and
// closes its connections to the old master, in use ones too, on
// +switch-master; it needs only the retry below.
//
// So the store tries an operation more than once within its timeout: after
// a try that failed as a failover fails (no connection, a redirect, a
// cluster or replica error) it has a Cluster's slot map reloaded and tries
// again. Once such a failure, or a call that ran out of time, was seen, and
// for suspectWindow after the last one, each try also gets AttemptTimeout
// (plus WaitTimeout with WAIT), after which a hung master is abandoned.
// Retrying is safe because every transition is: a script run twice for the
// same call answers as the first run did and changes nothing. The normal
// case stays one round trip.
//
// The reload is go-redis's own (ReloadState): it runs in the background,
// one at a time, at most once per 200 ms however many calls ask for it. It
// asks the known nodes for CLUSTER SLOTS one after another and takes the
// first answer; clusterSlotsProbe bounds each question, so that a hung node
// it happens to ask delays it by probeTimeout rather than by the client's
// read timeout and retries (seconds).

const (
	// minAttemptTimeout is the shortest default AttemptTimeout.
	minAttemptTimeout = 100 * time.Millisecond
	// probeTimeout bounds one node's answer to CLUSTER SLOTS during a
	// reload of the slot map.
	probeTimeout = 250 * time.Millisecond
	// suspectWindow is how long after a call failed as a failover fails
	// the store bounds each try by AttemptTimeout. Every such failure
	// starts it again, so it lasts while a failover does.
	suspectWindow = 10 * time.Second
	// retryBackoff is the first pause between tries; it doubles up to
	// maxRetryBackoff.
	retryBackoff    = 20 * time.Millisecond
	maxRetryBackoff = 100 * time.Millisecond
)

// errSlotMoved replaces a redirect that the store could not follow within
// its timeout, so that no error carries a Redis redirect.
var errSlotMoved = errors.New("the key's hash slot moved to another node and the time ran out following it")

// defaultAttemptTimeout is a quarter of the operation's timeout, at least
// minAttemptTimeout and at most the timeout itself.
func defaultAttemptTimeout(timeout time.Duration) time.Duration {
	return min(timeout, max(timeout/4, minAttemptTimeout))
}

// followFailovers makes a Cluster client's reloads of the slot map
// quick to skip a hung node (see clusterSlotsProbe). It reaches the node
// clients the ClusterClient creates from now on.
func followFailovers(client redis.UniversalClient) {
	if c, ok := client.(*redis.ClusterClient); ok {
		c.OnNewNode(func(node *redis.Client) { node.AddHook(clusterSlotsProbe{}) })
	}
}

// retrying calls try until it succeeds, fails for a reason a retry cannot
// mend, or ctx ends. After a try that failed as a failover fails, the slot
// map of a Cluster is reloaded before the next. While the store is
// suspicious (a call failed so within suspectWindow), each try also gets a
// deadline of its own (attemptTimeout), so that a try stuck on a hung
// master gives way to one that reaches the promoted replica. Otherwise a
// try may take the whole of ctx: under load, calls wait for a pooled
// connection in turn, and a try given up would lose its turn.
func (s *Store) retrying(ctx context.Context, try func(ctx context.Context) error) error {
	backoff := retryBackoff
	for {
		tctx, cancel := ctx, context.CancelFunc(nil)
		if time.Now().UnixNano() < s.suspectUntil.Load() {
			tctx, cancel = context.WithTimeout(ctx, s.attemptTimeout)
		}
		err := try(tctx)
		hung := tctx.Err() != nil
		if cancel != nil {
			cancel()
		}
		if err == nil {
			return nil
		}
		failover := isFailover(err)
		if failover || (hung && ctx.Err() != nil) {
			s.suspectUntil.Store(time.Now().Add(suspectWindow).UnixNano())
		}
		// A try that ran out of its own time may fail with the context's
		// error rather than the connection's.
		retry := failover || (hung && errors.Is(err, context.DeadlineExceeded))
		if ctx.Err() != nil || !retry {
			return unredirected(err)
		}
		if c, ok := s.client.(*redis.ClusterClient); ok {
			c.ReloadState(ctx)
		}
		select {
		case <-ctx.Done():
			return unredirected(err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxRetryBackoff)
	}
}

// isFailover reports whether err is how a call fails while Redis fails
// over or moves slots: no connection (any error that is not Redis's
// reply), a redirect, or a node that is not (yet) able to serve the key.
// WAIT's too few replicas, a closed client and the caller's own deadline
// are not.
func isFailover(err error) bool {
	if errors.Is(err, errTooFewReplicas) || errors.Is(err, redis.ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var reply redis.Error
	if !errors.As(err, &reply) {
		return true // the connection failed
	}
	for _, prefix := range []string{"MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "READONLY", "LOADING", "MASTERDOWN"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	return false
}

// unredirected returns err, or errSlotMoved in place of a redirect.
func unredirected(err error) error {
	if redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") {
		return errSlotMoved
	}
	return err
}

// clusterSlotsProbe bounds CLUSTER SLOTS by probeTimeout: the question a
// ClusterClient asks a node when it reloads its slot map. The bound holds
// on clients with ContextTimeoutEnabled.
type clusterSlotsProbe struct{}

func (clusterSlotsProbe) DialHook(next redis.DialHook) redis.DialHook { return next }

func (clusterSlotsProbe) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (clusterSlotsProbe) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "cluster" {
			return next(ctx, cmd)
		}
		if args := cmd.Args(); len(args) != 2 {
			return next(ctx, cmd)
		} else if sub, _ := args[1].(string); !strings.EqualFold(sub, "slots") {
			return next(ctx, cmd)
		}
		ctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		return next(ctx, cmd)
	}
}
