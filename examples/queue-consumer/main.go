// SPDX-License-Identifier: Apache-2.0

// Command queue-consumer shows a consumer of an at-least-once queue that
// applies each message's side effect once, deduplicating deliveries with
// idem.Do and the message id as the idempotency key.
//
// The broker is NATS JetStream when --nats-url or NATS_URL names a server
// (jetstream.go): the producer publishes some messages twice, as a retry
// does, and some workers die after their work and before their ack, left
// for JetStream to deliver again after AckWait. Otherwise it is an
// in-process channel (broker.go) that delivers every message two or three
// times on purpose. Both deliver again what is nacked. The side effect is
// crediting an account in an in-memory ledger. The demo publishes a batch
// of messages, a few of them poison and a few whose first attempt fails,
// consumes them with concurrent workers, and checks that every good
// message was applied exactly once.
//
// Usage:
//
//	IDEMSVC_URL=http://127.0.0.1:8080 go run ./examples/queue-consumer [--messages 200] [--workers 8]
//	NATS_URL=nats://127.0.0.1:4222 go run ./examples/queue-consumer
//
// Configuration: IDEMSVC_URL (default http://127.0.0.1:8080),
// IDEMSVC_API_KEY, and NATS_URL (or --nats-url; default none: the
// channel). It exits with status 1 when a message was applied other than
// once.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Environ(), os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "queue-consumer:", err)
		os.Exit(1)
	}
}

// run runs the demo against the idemsvc that env names and prints its
// report on out.
func run(ctx context.Context, args, env []string, out io.Writer) error {
	vars := make(map[string]string)
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	idemURL := "http://127.0.0.1:8080"
	if v := vars["IDEMSVC_URL"]; v != "" {
		idemURL = v
	}
	cfg := demoConfig{Group: "ledger", PoisonEvery: 25, FlakyEvery: 7, RetryEvery: 3, CrashEvery: 5, AckWait: time.Second}
	fs := flag.NewFlagSet("queue-consumer", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&cfg.NATSURL, "nats-url", vars["NATS_URL"], "NATS JetStream server to use (default $NATS_URL; none: an in-process channel)")
	fs.IntVar(&cfg.Messages, "messages", 200, "messages to publish")
	fs.IntVar(&cfg.Workers, "workers", 8, "concurrent workers")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the channel's delivery order")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.Messages <= 0 || cfg.Workers <= 0 {
		return errors.New("--messages and --workers must be positive")
	}
	client, err := idem.New(idemURL, idem.WithAPIKey(vars["IDEMSVC_API_KEY"]))
	if err != nil {
		return err
	}
	rep, err := runDemo(ctx, client, cfg)
	if err != nil {
		return err
	}
	rep.print(out)
	return rep.check()
}

// demoConfig shapes a demo run.
type demoConfig struct {
	Group       string // the consumer's name, part of each key
	Messages    int    // messages published
	Workers     int    // concurrent workers
	PoisonEvery int    // every n'th message is poison (0: none)
	FlakyEvery  int    // every n'th message fails its first attempt (0: none)
	Seed        uint64 // the channel's delivery order

	// NATS JetStream, when NATSURL is set.
	NATSURL    string
	RetryEvery int           // every n'th message is published twice (0: none)
	CrashEvery int           // every n'th message's first ack is lost to a worker dying (0: none)
	AckWait    time.Duration // how long JetStream waits for an ack before delivering again
}

// every reports whether the i'th message (from 0) is an n'th one.
func every(n, i int) bool { return n > 0 && i%n == n-1 }

// report is what a demo run did.
type report struct {
	Queue        string // the broker
	Published    int
	IDs          []string // every message's id, in publishing order
	Good, Poison []string // message ids
	Broker       BrokerStats
	Consumer     ConsumerStats
	Applied      map[string]int // times each message's effect was applied
	Attempts     map[string]int // times Handle ran for each message
	Balance      int64          // the ledger's sum of credits
	WantBalance  int64          // the sum of the good messages' amounts
}

// runDemo publishes cfg.Messages messages with ids unique to this run (so
// that a long-lived idemsvc never replays an earlier run's), consumes them
// with cfg.Workers workers until the broker has every delivery acked, and
// reports. The broker is JetStream if cfg.NATSURL is set, else the
// channel.
func runDemo(ctx context.Context, client *idem.Client, cfg demoConfig) (*report, error) {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail
	runID := hex.EncodeToString(b[:])

	rep := &report{Queue: "in-process channel", Published: cfg.Messages}
	if cfg.NATSURL != "" {
		rep.Queue = fmt.Sprintf("NATS JetStream at %s, AckWait %s", cfg.NATSURL, cfg.AckWait)
	}
	msgs := make([]Message, cfg.Messages)
	flaky, dying := make(map[string]bool), make(map[string]bool)
	for i := range msgs {
		id := fmt.Sprintf("credit-%s-%04d", runID, i)
		amount := int64(i%9+1) * 100
		body := strconv.FormatInt(amount, 10)
		switch {
		case every(cfg.PoisonEvery, i):
			body = "one hundred" // not an amount: no attempt can succeed
			rep.Poison = append(rep.Poison, id)
		default:
			rep.Good = append(rep.Good, id)
			rep.WantBalance += amount
		}
		if cfg.FlakyEvery > 0 && i%cfg.FlakyEvery == 0 {
			flaky[id] = true
		}
		if cfg.NATSURL != "" && every(cfg.CrashEvery, i) {
			dying[id] = true // only JetStream delivers an unacked message again
		}
		msgs[i] = Message{ID: id, Body: []byte(body)}
		rep.IDs = append(rep.IDs, id)
	}

	ledger := newLedger()
	var mu sync.Mutex
	attempts := make(map[string]int)
	consumer := &Consumer{
		Client: client,
		Group:  cfg.Group,
		Handle: func(ctx context.Context, m Message) ([]byte, error) {
			mu.Lock()
			attempts[m.ID]++
			first := attempts[m.ID] == 1
			mu.Unlock()
			if first && flaky[m.ID] {
				// The downstream timed out before anything happened: a
				// retryable failure; the broker delivers the message again.
				return nil, fmt.Errorf("message %s: ledger timed out", m.ID)
			}
			amount, err := strconv.ParseInt(string(m.Body), 10, 64)
			if err != nil {
				// Retrying cannot help: store the failure for good.
				return nil, idem.Terminal(fmt.Errorf("message %s: bad amount %q", m.ID, m.Body))
			}
			balance := ledger.credit(m.ID, amount)
			return []byte(fmt.Sprintf("credited %d, balance %d", amount, balance)), nil
		},
		// The worker dies before the first ack of a dying message.
		dieBeforeAck: func(m Message) bool {
			mu.Lock()
			defer mu.Unlock()
			die := dying[m.ID]
			delete(dying, m.ID)
			return die
		},
	}

	var err error
	if cfg.NATSURL != "" {
		rep.Broker, err = runJetStream(ctx, cfg, runID, msgs, consumer)
	} else {
		rep.Broker = runChannel(ctx, cfg, msgs, consumer)
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	rep.Consumer = consumer.Stats()
	rep.Applied, rep.Balance = ledger.snapshot()
	mu.Lock()
	rep.Attempts = attempts
	mu.Unlock()
	return rep, nil
}

// runChannel is the demo on the in-process Broker: it consumes msgs with
// cfg.Workers workers until the broker has every delivery acked.
func runChannel(ctx context.Context, cfg demoConfig, msgs []Message, consumer *Consumer) BrokerStats {
	broker := NewBroker(ctx, msgs, cfg.Seed)
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Go(func() { consumer.Consume(ctx, broker.Deliveries()) })
	}
	wg.Wait()
	return broker.Stats()
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "broker:         %s\n", r.Queue)
	fmt.Fprintf(w, "published:      %d messages (%d good, %d poison)\n", r.Published, len(r.Good), len(r.Poison))
	fmt.Fprintf(w, "delivered:      %d times (%d copies queued, %d redelivered)\n",
		r.Broker.Delivered, r.Broker.Copies, r.Broker.Redelivered)
	fmt.Fprintf(w, "processed:      %d\n", r.Consumer.Processed)
	fmt.Fprintf(w, "replayed:       %d duplicates skipped\n", r.Consumer.Replayed)
	fmt.Fprintf(w, "dead-lettered:  %d deliveries of poison messages\n", r.Consumer.DeadLettered)
	fmt.Fprintf(w, "nacked:         %d retryable failures\n", r.Consumer.Nacked)
	fmt.Fprintf(w, "acks lost:      %d to a worker dying after its work\n", r.Consumer.Died)
	applied := 0
	for _, n := range r.Applied {
		applied += n
	}
	fmt.Fprintf(w, "effects:        %d applied for %d good messages\n", applied, len(r.Good))
	fmt.Fprintf(w, "balance:        %d (want %d)\n", r.Balance, r.WantBalance)
}

// check reports a message applied other than once, or a wrong balance.
func (r *report) check() error {
	var errs []error
	for _, id := range r.Good {
		if n := r.Applied[id]; n != 1 {
			errs = append(errs, fmt.Errorf("message %s applied %d times", id, n))
		}
	}
	for _, id := range r.Poison {
		if n := r.Applied[id]; n != 0 {
			errs = append(errs, fmt.Errorf("poison message %s applied %d times", id, n))
		}
	}
	if r.Balance != r.WantBalance {
		errs = append(errs, fmt.Errorf("balance %d, want %d", r.Balance, r.WantBalance))
	}
	return errors.Join(errs...)
}

// ledger is the side effect: credits to one account, remembered by
// message id so that the demo can count how often each was applied.
type ledger struct {
	mu      sync.Mutex
	applied map[string]int
	balance int64
}

func newLedger() *ledger { return &ledger{applied: make(map[string]int)} }

func (l *ledger) credit(id string, amount int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.applied[id]++
	l.balance += amount
	return l.balance
}

func (l *ledger) snapshot() (map[string]int, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	applied := make(map[string]int, len(l.applied))
	for id, n := range l.applied {
		applied[id] = n
	}
	return applied, l.balance
}
