// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/testkit/idemtest"
)

// startIdemsvc serves an in-process idemsvc on a real loopback port until
// the test ends.
func startIdemsvc(t *testing.T) string {
	t.Helper()
	return idemtest.Serve(t, handlers.Config{}).URL
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

// startNATS runs a nats-server of the test's own, with JetStream, on a free
// loopback port, and kills it when the test ends.
func startNATS(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		t.Fatalf("nats-server not found on PATH (%v): the JetStream tests start a real one. "+
			"Install it, e.g. apt-get install nats-server (scripts/test.sh does), and mind that "+
			"Debian puts it in /usr/sbin, which must be on PATH", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	_, port, _ := net.SplitHostPort(addr)

	logPath := filepath.Join(t.TempDir(), "nats-server.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin, "-js", "-a", "127.0.0.1", "-p", port, "-sd", t.TempDir())
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting nats-server: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // by its pid
		<-exited
	})

	url := "nats://" + addr
	deadline := time.Now().Add(10 * time.Second)
	for {
		nc, err := nats.Connect(url, nats.Timeout(time.Second))
		if err == nil {
			nc.Close()
			return url
		}
		log, _ := os.ReadFile(logPath)
		select {
		case <-exited:
			t.Fatalf("nats-server exited:\n%s", log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server does not accept connections at %s: %v\n%s", url, err, log)
		}
	}
}

// Against a real NATS JetStream, with 16 workers pulling from one
// consumer: the producer publishes every 3rd message twice, the first
// attempt of every 7th fails (Nak, delivered again at once), the worker
// handling every 5th dies after Do and before its ack (delivered again
// after AckWait), every 25th is poison. Every good message's effect is
// applied exactly once, though there were more deliveries than messages.
func TestJetStreamEachMessageAppliedOnce(t *testing.T) {
	natsURL := startNATS(t)
	client, err := idem.New(startIdemsvc(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := demoConfig{Group: "ledger", Messages: 150, Workers: 16, PoisonEvery: 25, FlakyEvery: 7,
		NATSURL: natsURL, RetryEvery: 3, CrashEvery: 5, AckWait: time.Second}
	rep, err := runDemo(testContext(t), client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.check(); err != nil {
		t.Error(err)
	}
	applied := 0
	for _, n := range rep.Applied {
		applied += n
	}
	if applied != len(rep.Good) || len(rep.Applied) != len(rep.Good) || len(rep.Good) != cfg.Messages-cfg.Messages/cfg.PoisonEvery {
		t.Errorf("%d effects over %d messages, want one per good message (%d)", applied, len(rep.Applied), len(rep.Good))
	}

	var retried, flaky, dying int
	for i, id := range rep.IDs {
		want := 1
		if i%cfg.FlakyEvery == 0 {
			want = 2
			flaky++
		}
		if rep.Attempts[id] != want {
			t.Errorf("handler ran %d times for %s, want %d", rep.Attempts[id], id, want)
		}
		if every(cfg.RetryEvery, i) {
			retried++
		}
		if every(cfg.CrashEvery, i) {
			dying++
		}
	}

	// The duplicates were real: the producer's retries, the nacks and the
	// lost acks were all delivered again.
	b, c := rep.Broker, rep.Consumer
	t.Logf("broker %+v, consumer %+v", b, c)
	if b.Copies != cfg.Messages+retried {
		t.Errorf("%d messages in the stream, want %d + %d retries", b.Copies, cfg.Messages, retried)
	}
	if c.Nacked != int64(flaky) || c.Died != int64(dying) {
		t.Errorf("nacked %d, acks lost %d; want %d, %d", c.Nacked, c.Died, flaky, dying)
	}
	if least := b.Copies + flaky + dying; b.Delivered < least || b.Redelivered < flaky+dying {
		t.Errorf("delivered %d times, %d again; want at least %d, %d", b.Delivered, b.Redelivered, least, flaky+dying)
	}
	if b.Delivered <= cfg.Messages {
		t.Errorf("delivered %d times for %d messages: no duplicates", b.Delivered, cfg.Messages)
	}
	if c.Processed != int64(len(rep.Good)) {
		t.Errorf("processed %d, want %d", c.Processed, len(rep.Good))
	}
	if acked := c.Processed + c.Replayed + c.DeadLettered - c.Died; acked < int64(b.Copies) {
		t.Errorf("acked %d deliveries, fewer than the %d messages in the stream", acked, b.Copies)
	}
}

// The same JetStream queue without idem.Do: a producer's retry and a
// delivery again after a worker died before its ack are applied again.
func TestJetStreamDeliversDuplicates(t *testing.T) {
	ctx := testContext(t)
	nc, err := nats.Connect(startNATS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	subject := natsSubject + ".plain"
	cons, err := jetStreamQueue(ctx, js, "plain", subject, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// m-0, m-2... are published twice; the worker dies before acking the
	// first delivery of m-0, m-3, m-6...
	var pubs []Message
	for i := range 20 {
		m := Message{ID: fmt.Sprintf("m-%d", i)}
		pubs = append(pubs, m)
		if i%2 == 0 {
			pubs = append(pubs, m)
		}
	}
	lastSeq, err := publishJetStream(ctx, js, subject, pubs)
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	applied := make(map[string]int)
	workCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				msg, err := cons.Next(jetstream.FetchContext(workCtx))
				if err != nil {
					return
				}
				id := msg.Headers().Get(MsgIDHeader)
				i, _ := strconv.Atoi(strings.TrimPrefix(id, "m-"))
				mu.Lock()
				applied[id]++ // the effect, not deduplicated
				die := i%3 == 0 && applied[id] == 1
				mu.Unlock()
				if !die {
					_ = msg.Ack()
				}
			}
		})
	}
	_, err = waitAcked(ctx, cons, lastSeq)
	stop()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		id := fmt.Sprintf("m-%d", i)
		want := 1
		if i%2 == 0 {
			want++ // published again
		}
		if i%3 == 0 {
			want++ // delivered again after AckWait
		}
		if applied[id] != want {
			t.Errorf("%s applied %d times, want %d", id, applied[id], want)
		}
	}
}

// The command against NATS JetStream named by NATS_URL.
func TestRunJetStream(t *testing.T) {
	env := []string{"IDEMSVC_URL=" + startIdemsvc(t), "NATS_URL=" + startNATS(t)}
	var out bytes.Buffer
	if err := run(testContext(t), []string{"--messages", "40", "--workers", "4"}, env, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{"broker:         NATS JetStream at nats://127.0.0.1:", "effects:        39 applied for 39 good messages", "acks lost:      8 "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report without %q:\n%s", want, out.String())
		}
	}
}
