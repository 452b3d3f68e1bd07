// SPDX-License-Identifier: Apache-2.0

package statemachine

import "context"

// BatchBegin is one begin of a batch, for the tenant it names.
type BatchBegin struct {
	Tenant string
	BeginRequest
}

// BeginOutcome is what one begin of a batch came to: what Begin would have
// returned for it.
type BeginOutcome struct {
	Result BeginResult
	Err    error
}

// BatchFinish is one complete or fail of a batch, for the tenant it names:
// exactly one of Complete and Fail is set.
type BatchFinish struct {
	Tenant   string
	Complete *CompleteRequest
	Fail     *FailRequest
}

// FinishOutcome is what one finish of a batch came to: what Complete or
// Fail would have returned for it.
type FinishOutcome struct {
	Record Record
	Err    error
}

// Batcher runs many transitions in one call: each item as its single call
// would run, its outcome at the item's index. A store that can sends them
// together (redisstore.Store: one pipelined round trip per master).
type Batcher interface {
	BeginBatch(ctx context.Context, items []BatchBegin) []BeginOutcome
	FinishBatch(ctx context.Context, items []BatchFinish) []FinishOutcome
}

// finishOne runs one finish of a batch through store's single calls.
func finishOne(ctx context.Context, store Store, it *BatchFinish) FinishOutcome {
	var o FinishOutcome
	if it.Complete != nil {
		o.Record, o.Err = store.Complete(ctx, it.Tenant, *it.Complete)
	} else {
		o.Record, o.Err = store.Fail(ctx, it.Tenant, *it.Fail)
	}
	return o
}

// BeginBatch implements Batcher: the items in turn.
func (m *MemoryStore) BeginBatch(ctx context.Context, items []BatchBegin) []BeginOutcome {
	out := make([]BeginOutcome, len(items))
	for i := range items {
		out[i].Result, out[i].Err = m.Begin(ctx, items[i].Tenant, items[i].BeginRequest)
	}
	return out
}

// FinishBatch implements Batcher: the items in turn.
func (m *MemoryStore) FinishBatch(ctx context.Context, items []BatchFinish) []FinishOutcome {
	out := make([]FinishOutcome, len(items))
	for i := range items {
		out[i] = finishOne(ctx, m, &items[i])
	}
	return out
}
