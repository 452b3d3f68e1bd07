package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

// startIdemsvc serves an in-process idemsvc on a real loopback port until
// the test ends.
func startIdemsvc(t *testing.T) string {
	t.Helper()
	svc := handlers.New(handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits())})
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	t.Cleanup(svc.StopWaiting)
	return srv.URL
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// The broker alone, with a consumer that does not deduplicate: every
// message's effect is applied as often as it is delivered. This is what
// the consumer with idem.Do must prevent.
func TestBrokerDeliversDuplicates(t *testing.T) {
	ctx := testContext(t)
	msgs := make([]Message, 50)
	for i := range msgs {
		msgs[i] = Message{ID: fmt.Sprintf("m-%d", i)}
	}
	broker := NewBroker(ctx, msgs, 7)
	var mu sync.Mutex
	seen := make(map[string]int)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for d := range broker.Deliveries() {
				mu.Lock()
				seen[d.ID]++
				first := seen[d.ID] == 1
				mu.Unlock()
				if first {
					d.Nack() // the first delivery of each message is handed back
				} else {
					d.Ack()
				}
			}
		})
	}
	wg.Wait()
	stats := broker.Stats()
	if len(seen) != len(msgs) {
		t.Fatalf("%d messages delivered, want %d", len(seen), len(msgs))
	}
	total := 0
	for id, n := range seen {
		if n < 2 {
			t.Errorf("message %s delivered %d times, want at least 2", id, n)
		}
		total += n
	}
	if stats.Copies < 2*len(msgs) || stats.Copies > 3*len(msgs) {
		t.Errorf("copies = %d for %d messages, want 2 or 3 each", stats.Copies, len(msgs))
	}
	if stats.Redelivered != len(msgs) || stats.Delivered != stats.Copies+stats.Redelivered || total != stats.Delivered {
		t.Errorf("stats %+v, deliveries seen %d", stats, total)
	}
}

// Concurrent workers, every message delivered two or three times, some
// duplicates handled at the same moment, some first attempts failing and
// redelivered, some poison: every good message's effect is applied exactly
// once, and the handler runs once per message but for the retried ones.
func TestEachMessageAppliedOnce(t *testing.T) {
	url := startIdemsvc(t)
	client, err := idem.New(url)
	if err != nil {
		t.Fatal(err)
	}
	for _, seed := range []uint64{1, 2} {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			cfg := demoConfig{Group: "ledger", Messages: 150, Workers: 16, PoisonEvery: 25, FlakyEvery: 7, Seed: seed}
			rep, err := runDemo(testContext(t), client, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := rep.check(); err != nil {
				t.Error(err)
			}

			// Effects == unique good messages.
			applied := 0
			for _, n := range rep.Applied {
				applied += n
			}
			if applied != len(rep.Good) || len(rep.Applied) != len(rep.Good) {
				t.Errorf("%d effects over %d messages, want %d: one per good message", applied, len(rep.Applied), len(rep.Good))
			}
			if len(rep.Poison) != cfg.Messages/cfg.PoisonEvery || len(rep.Good)+len(rep.Poison) != cfg.Messages {
				t.Fatalf("%d good and %d poison messages", len(rep.Good), len(rep.Poison))
			}
			if rep.Balance != rep.WantBalance {
				t.Errorf("balance %d, want %d", rep.Balance, rep.WantBalance)
			}

			// The duplicates were real, and each was settled once.
			b, c := rep.Broker, rep.Consumer
			if b.Copies < 2*cfg.Messages {
				t.Errorf("%d copies for %d messages: the broker did not duplicate", b.Copies, cfg.Messages)
			}
			if c.Processed+c.Replayed+c.DeadLettered != int64(b.Copies) {
				t.Errorf("acked %d+%d+%d deliveries, want the %d copies", c.Processed, c.Replayed, c.DeadLettered, b.Copies)
			}
			if c.Processed != int64(len(rep.Good)) {
				t.Errorf("processed %d, want %d", c.Processed, len(rep.Good))
			}
			if c.Replayed < int64(len(rep.Good)) {
				t.Errorf("replayed %d, want at least one duplicate per good message (%d)", c.Replayed, len(rep.Good))
			}

			// The handler ran once per message, twice for those whose first
			// attempt failed retryably; those, and only those, were nacked
			// and redelivered.
			flaky := 0
			if len(rep.IDs) != cfg.Messages {
				t.Fatalf("%d ids for %d messages", len(rep.IDs), cfg.Messages)
			}
			for i, id := range rep.IDs {
				want := 1
				if i%cfg.FlakyEvery == 0 {
					want = 2
					flaky++
				}
				if rep.Attempts[id] != want {
					t.Errorf("handler ran %d times for %s, want %d", rep.Attempts[id], id, want)
				}
			}
			if c.Nacked != int64(flaky) || b.Redelivered != flaky {
				t.Errorf("nacked %d, redelivered %d; want %d", c.Nacked, b.Redelivered, flaky)
			}
			for _, id := range rep.Poison {
				if rep.Applied[id] != 0 {
					t.Errorf("poison message %s applied", id)
				}
			}
		})
	}
}

// A second consumer group handles the same messages on its own, once.
func TestGroupsAreIndependent(t *testing.T) {
	url := startIdemsvc(t)
	client, err := idem.New(url)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{ID: "order-1", Body: []byte("100")}, {ID: "order-2", Body: []byte("200")}}
	var mu sync.Mutex
	applied := make(map[string]int)
	for _, group := range []string{"billing", "shipping"} {
		c := &Consumer{Client: client, Group: group, Handle: func(_ context.Context, m Message) ([]byte, error) {
			mu.Lock()
			applied[group+"/"+m.ID]++
			mu.Unlock()
			return nil, nil
		}}
		broker := NewBroker(testContext(t), msgs, 3)
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() { c.Consume(t.Context(), broker.Deliveries()) })
		}
		wg.Wait()
	}
	for _, k := range []string{"billing/order-1", "billing/order-2", "shipping/order-1", "shipping/order-2"} {
		if applied[k] != 1 {
			t.Errorf("%s applied %d times, want 1 (all: %v)", k, applied[k], applied)
		}
	}
}

// The command, as run from the shell, against an idemsvc named by
// IDEMSVC_URL.
func TestRun(t *testing.T) {
	url := startIdemsvc(t)
	var out bytes.Buffer
	err := run(testContext(t), []string{"--messages", "60", "--workers", "6"}, []string{"IDEMSVC_URL=" + url}, &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "effects:        58 applied for 58 good messages") {
		t.Errorf("report:\n%s", out.String())
	}
	// A second run against the same idemsvc uses new message ids, so it
	// applies its messages too instead of replaying the first run's.
	out.Reset()
	if err := run(testContext(t), []string{"--messages", "10"}, []string{"IDEMSVC_URL=" + url}, &out); err != nil {
		t.Fatalf("second run: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "effects:        10 applied for 10 good messages") {
		t.Errorf("second report:\n%s", out.String())
	}
}
