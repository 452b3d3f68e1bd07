// SPDX-License-Identifier: Apache-2.0

package robustness

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Traffic drives idemsvc the way callers do: contended keys, with new keys
// entering all the time; begins with owners (some waiting, some with
// fingerprints); completes, fails and extends; holders that crash and
// leave their lease to expire, and slow holders that complete after a
// takeover. Calls with an unknown outcome are retried only as the
// contract says is safe: begin with the same owner, complete and fail
// with the same lease token.
type Traffic struct {
	Rec *Recorder
	// Targets returns the base URLs of the idemsvc instances.
	Targets []string
	Clients int
	// Keys is how many keys are in use at once; each is retired after
	// BeginsPerKey begins and a new one takes its place.
	Keys         int
	BeginsPerKey int
	// RetryFor bounds the retries of one call with an unknown outcome.
	RetryFor time.Duration
	Seed     uint64

	mu      sync.Mutex
	slots   []keySlot
	nextKey int
}

type keySlot struct {
	name   string
	begins int
}

// Run sends traffic until ctx ends.
func (t *Traffic) Run(ctx context.Context) {
	t.slots = make([]keySlot, t.Keys)
	for i := range t.slots {
		t.slots[i] = t.newSlot()
	}
	var wg sync.WaitGroup
	for id := range t.Clients {
		wg.Go(func() { t.worker(ctx, id) })
	}
	wg.Wait()
}

func (t *Traffic) newSlot() keySlot {
	t.nextKey++
	return keySlot{name: fmt.Sprintf("k%d-%d", t.Seed, t.nextKey)}
}

// pick returns a key in use, retiring it once it had its begins.
func (t *Traffic) pick(rng *rand.Rand) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := rng.IntN(len(t.slots))
	t.slots[i].begins++
	name := t.slots[i].name
	if t.slots[i].begins >= t.BeginsPerKey {
		t.slots[i] = t.newSlot()
	}
	return name
}

// beginTries bounds the tries of a begin with an unknown outcome.
const beginTries = 4

type worker struct {
	t   *Traffic
	id  int
	rng *rand.Rand
	c   *client
	seq int
}

func (t *Traffic) worker(ctx context.Context, id int) {
	w := &worker{t: t, id: id, rng: rand.New(rand.NewPCG(t.Seed, uint64(id))), c: newClient(APIKey, 4*time.Second)}
	for ctx.Err() == nil {
		w.seq++
		key := t.pick(w.rng)
		in := Input{Kind: Begin, LeaseMs: int64(300 + w.rng.IntN(300))}
		if w.rng.IntN(10) < 7 {
			in.Owner = fmt.Sprintf("w%d-%d", id, w.seq)
		}
		// Every other key carries a fingerprint; a few begins send
		// another one, which must be refused once the record exists.
		if len(key)%2 == 0 {
			in.Fingerprint = "fp-" + key
			if w.rng.IntN(40) == 0 {
				in.Fingerprint = "other"
			}
		}
		if w.rng.IntN(4) == 0 {
			in.WaitMs = int64(200 + w.rng.IntN(600))
		}
		out := w.do(ctx, key, in, in.Owner != "")
		if out.Result == Acquired {
			w.hold(ctx, key, out, in.LeaseMs)
		} else {
			w.sleep(ctx, 10+w.rng.IntN(60))
		}
	}
}

func (w *worker) sleep(ctx context.Context, ms int) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Duration(ms) * time.Millisecond):
	}
}

// hold plays the holder of a lease: it completes (sometimes after its
// lease ran out), extends then completes, fails, or crashes.
func (w *worker) hold(ctx context.Context, key string, lease Output, leaseMs int64) {
	body := fmt.Sprintf("w%d-%d", w.id, w.seq)
	finish := Input{Kind: Complete, Token: lease.Token, Body: body}
	switch r := w.rng.IntN(100); {
	case r < 50:
		w.sleep(ctx, w.rng.IntN(int(leaseMs*13/10)))
	case r < 62:
		w.sleep(ctx, int(leaseMs/2))
		ext := Input{Kind: Extend, Token: lease.Token, LeaseMs: leaseMs}
		if out := w.do(ctx, key, ext, true); out.Result != Extended {
			return
		}
		w.sleep(ctx, w.rng.IntN(int(leaseMs)))
	case r < 72:
		finish = Input{Kind: Fail, Token: lease.Token, Retryable: true, Body: body}
	case r < 82:
		finish = Input{Kind: Fail, Token: lease.Token, Body: body}
	default:
		return // the holder crashed: its lease runs out
	}
	w.do(ctx, key, finish, true)
}

// do sends in to a random instance and records it, retrying while the
// outcome is unknown if retry allows (the caller decides what the contract
// allows) and for at most RetryFor. It returns the last answer.
func (w *worker) do(ctx context.Context, key string, in Input, retry bool) Output {
	deadline := time.Now().Add(w.t.RetryFor)
	backoff := 100 * time.Millisecond
	for tries := 1; ; tries++ {
		inst := w.rng.IntN(len(w.t.Targets))
		call := w.t.Rec.Now()
		in.CallMs = time.Now().UnixMilli()
		out, err := w.c.call(ctx, w.t.Targets[inst], in, key)
		out.RetMs = time.Now().UnixMilli()
		if errors.Is(err, errNotSent) {
			// Refused: the instance is down, nothing was sent.
			out = Output{Result: Unknown, Detail: "connection refused"}
		} else {
			if err != nil {
				out = Output{Result: Unexpected, Detail: err.Error()}
			}
			w.t.Rec.Add(Op{Key: key, Client: w.id, Instance: inst, In: in, Out: out, Call: call, Return: w.t.Rec.Now()})
		}
		// A caller gives up a begin after a few tries (its lease, if it
		// got one, runs out); it keeps trying to store an outcome.
		if out.Result != Unknown || !retry || ctx.Err() != nil || time.Now().After(deadline) ||
			in.Kind == Begin && tries >= beginTries {
			return out
		}
		w.sleep(ctx, int(backoff/time.Millisecond))
		backoff = min(2*backoff, time.Second)
	}
}
