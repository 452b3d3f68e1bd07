// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/idemsvc/idemsvc/internal/statemachine"

	"github.com/redis/go-redis/v9"
)

// BeginBatch implements Batcher: each item checked and answered as Begin
// would, their scripts pipelined in one round trip per master.
func (s *Store) BeginBatch(ctx context.Context, items []statemachine.BatchBegin) []statemachine.BeginOutcome {
	out := make([]statemachine.BeginOutcome, len(items))
	calls := make([]scriptCall, len(items))
	run := make([]int, 0, len(items))
	for i := range items {
		c, err := s.beginCall(ctx, items[i].Tenant, &items[i].BeginRequest)
		if err != nil {
			out[i].Err = err
			continue
		}
		calls[i] = c
		run = append(run, i)
	}
	replies, errs := s.runBatch(ctx, "begin", true, calls, run)
	for _, i := range run {
		if errs[i] != nil {
			out[i].Err = errs[i]
			continue
		}
		if err := s.readResponse(ctx, calls[i].key, &replies[i]); err != nil {
			out[i].Err = err // a record changed while read: the item may be sent again
			continue
		}
		out[i].Result, out[i].Err = calls[i].beginResult(items[i].Tenant, &replies[i])
	}
	return out
}

// FinishBatch implements Batcher: each item checked and answered as
// Complete or Fail would, their scripts pipelined in one round trip per
// master.
func (s *Store) FinishBatch(ctx context.Context, items []statemachine.BatchFinish) []statemachine.FinishOutcome {
	out := make([]statemachine.FinishOutcome, len(items))
	calls := make([]scriptCall, len(items))
	ops := make([]string, len(items))
	run := make([]int, 0, len(items))
	for i := range items {
		it := &items[i]
		var c scriptCall
		var err error
		if it.Complete != nil {
			ops[i] = "complete"
			c, err = s.completeCall(it.Tenant, it.Complete)
		} else {
			ops[i] = "fail"
			c, err = s.failCall(it.Tenant, it.Fail)
		}
		if err != nil {
			out[i].Err = err
			continue
		}
		calls[i] = c
		run = append(run, i)
	}
	replies, errs := s.runBatch(ctx, "finish", false, calls, run)
	for _, i := range run {
		out[i].Record, out[i].Err = calls[i].finished(items[i].Tenant, ops[i], replies[i], errs[i])
	}
	return out
}

// runBatch runs the calls at the indexes run, pipelined, as run runs one:
// within one slot of MaxInFlight and the store's timeout, tried again
// while Redis fails over (only the calls still without an answer). An
// error of a call is ErrStoreUnavailable: its script may or may not have
// run.
func (s *Store) runBatch(ctx context.Context, op string, shed bool, calls []scriptCall, run []int) ([]reply, []error) {
	replies := make([]reply, len(calls))
	errs := make([]error, len(calls))
	if len(run) == 0 {
		return replies, errs
	}
	if err := s.admit(ctx, shed); err != nil {
		for _, i := range run {
			errs[i] = fmt.Errorf("%s batch: %w", op, err)
		}
		return replies, errs
	}
	defer func() { <-s.slots }()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	cmds := make([]*redis.Cmd, len(calls))
	pending := run
	err := s.retrying(ctx, func(ctx context.Context) error {
		err := s.sendBatch(ctx, calls, pending, cmds, errs)
		left := pending[:0:0]
		for _, i := range pending {
			if errs[i] != nil {
				left = append(left, i)
			}
		}
		pending = left
		return err
	})
	for _, i := range run {
		if errs[i] != nil {
			if err == nil {
				err = errs[i]
			}
			errs[i] = fmt.Errorf("%w: %s batch: %w", statemachine.ErrStoreUnavailable, op, unredirected(errs[i]))
			continue
		}
		r, derr := decodeReply(cmds[i].Val())
		if derr != nil {
			errs[i] = fmt.Errorf("statemachine: %s batch: %w", op, derr)
			continue
		}
		replies[i] = r
	}
	return replies, errs
}

// sendBatch sends the calls at the indexes items in one pipeline per
// master, at the same time, and sets each one's command and error. Without
// WaitReplicas one pipeline on the client does (a ClusterClient splits it
// by master itself); with it, each master's pipeline runs on that master's
// connection and ends with WAIT, so that WAIT counts its scripts' writes.
func (s *Store) sendBatch(ctx context.Context, calls []scriptCall, items []int, cmds []*redis.Cmd, errs []error) error {
	cluster, ok := s.client.(*redis.ClusterClient)
	if s.waitReplicas == 0 || !ok {
		return s.sendPipeline(ctx, s.client, calls, items, cmds, errs)
	}
	type group struct {
		node  *redis.Client
		items []int
	}
	var groups []*group
	var noMaster error
	byAddr := map[string]*group{}
	for _, i := range items {
		master, err := cluster.MasterForKey(ctx, calls[i].key)
		if err != nil {
			errs[i] = err
			noMaster = err
			continue
		}
		g := byAddr[master.Options().Addr]
		if g == nil {
			g = &group{node: master}
			byAddr[master.Options().Addr] = g
			groups = append(groups, g)
		}
		g.items = append(g.items, i)
	}
	failed := make([]error, len(groups))
	var wg sync.WaitGroup
	for n, g := range groups {
		wg.Go(func() { failed[n] = s.sendPipeline(ctx, g.node, calls, g.items, cmds, errs) })
	}
	wg.Wait()
	return errors.Join(append(failed, noMaster)...)
}

// sendPipeline sends the calls at the indexes items in one pipeline on
// node (then WAIT, with WaitReplicas). Calls that meet an empty script
// cache (NOSCRIPT, which a pipeline does not handle as Script.Run does)
// are sent again with EVAL, which loads the script: they did not run.
func (s *Store) sendPipeline(ctx context.Context, node redis.Cmdable, calls []scriptCall, items []int, cmds []*redis.Cmd, errs []error) error {
	err := s.pipelineOnce(ctx, node, false, calls, items, cmds, errs)
	var reload []int
	for _, i := range items {
		if errs[i] != nil && redis.HasErrorPrefix(errs[i], "NOSCRIPT") {
			reload = append(reload, i)
		}
	}
	if len(reload) > 0 {
		err = s.pipelineOnce(ctx, node, true, calls, reload, cmds, errs)
	}
	return err
}

// pipelineOnce is one pipeline of sendPipeline: EVALSHA, or EVAL when
// eval; it returns the first error of a call.
func (s *Store) pipelineOnce(ctx context.Context, node redis.Cmdable, eval bool, calls []scriptCall, items []int, cmds []*redis.Cmd, errs []error) error {
	var wait *redis.Cmd
	_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, i := range items {
			c := &calls[i]
			keys := []string{c.key}
			if eval {
				cmds[i] = c.script.Eval(ctx, p, keys, c.args...)
			} else {
				cmds[i] = c.script.EvalSha(ctx, p, keys, c.args...)
			}
		}
		if s.waitReplicas > 0 {
			wait = p.Do(ctx, "WAIT", s.waitReplicas, s.waitTimeout.Milliseconds())
		}
		return nil
	}) // each command carries its own error
	var waitErr error
	if wait != nil {
		switch n, err := wait.Int64(); {
		case err != nil:
			waitErr = fmt.Errorf("WAIT: %w", err)
		case n < int64(s.waitReplicas):
			waitErr = fmt.Errorf("WAIT: %w: %d of %d within %s", errTooFewReplicas, n, s.waitReplicas, s.waitTimeout)
		}
	}
	var first error
	for _, i := range items {
		errs[i] = cmds[i].Err()
		if errs[i] == nil {
			errs[i] = waitErr
		}
		if first == nil && errs[i] != nil && !redis.HasErrorPrefix(errs[i], "NOSCRIPT") {
			first = errs[i]
		}
	}
	return first
}
