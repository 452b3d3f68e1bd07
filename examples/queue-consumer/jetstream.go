// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MsgIDHeader carries a message's id, set by its producer: the same in
// every copy of the message, a producer's retry included, unlike the
// stream sequence. The demo does not use Nats-Msg-Id, with which JetStream
// itself drops a retry published within the stream's duplicate window
// (2 minutes by default) and the demo's retries would never be delivered.
// A producer may set both: Do still covers what that window does not,
// redeliveries and later retries.
const MsgIDHeader = "Message-Id"

// The demo's stream: each run publishes on a subject of its own,
// natsSubject + "." + run id, read by a durable consumer of its own.
const (
	natsStream  = "IDEMSVC_QUEUE_CONSUMER"
	natsSubject = "idemsvc.queue-consumer"
)

// ConsumeJetStream is one worker on a JetStream pull consumer with explicit
// acks, until ctx ends: it pulls one message at a time and settles it as
// Consume does, with Ack, or Nak for JetStream to deliver it again at once.
// A message left unacked for the consumer's AckWait, by a worker that died
// for instance, is delivered again too. Run several workers, in one
// process or many, on one consumer. A message without an id cannot be
// deduplicated: it is terminated (never delivered again) unhandled.
func (c *Consumer) ConsumeJetStream(ctx context.Context, cons jetstream.Consumer) error {
	for {
		msg, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, nats.ErrTimeout) {
				continue // no message before the pull request expired
			}
			return err
		}
		id := msg.Headers().Get(MsgIDHeader)
		if id == "" {
			_ = msg.Term()
			continue
		}
		c.handle(ctx, Delivery{
			Message: Message{ID: id, Body: msg.Data()},
			Ack:     func() { _ = msg.Ack() },
			Nack:    func() { _ = msg.Nak() },
		})
	}
}

// jetStreamQueue makes the demo's stream, if need be, and a durable pull
// consumer named name of its messages on subject, acked explicitly and
// delivered again when unacked after ackWait.
func jetStreamQueue(ctx context.Context, js jetstream.JetStream, name, subject string, ackWait time.Duration) (jetstream.Consumer, error) {
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:     natsStream,
		Subjects: []string{natsSubject + ".>"},
		MaxAge:   time.Hour, // demo runs need not be kept
	})
	if err != nil {
		return nil, err
	}
	return js.CreateOrUpdateConsumer(ctx, natsStream, jetstream.ConsumerConfig{
		Durable:       name,
		FilterSubject: subject,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
	})
}

// publishJetStream publishes msgs on subject in order, each with its id in
// the MsgIDHeader header, and returns the stream sequence of the last.
func publishJetStream(ctx context.Context, js jetstream.JetStream, subject string, msgs []Message) (lastSeq uint64, err error) {
	for _, m := range msgs {
		msg := nats.NewMsg(subject)
		msg.Header.Set(MsgIDHeader, m.ID)
		msg.Data = m.Body
		ack, err := js.PublishMsg(ctx, msg)
		if err != nil {
			return 0, err
		}
		lastSeq = ack.Sequence
	}
	return lastSeq, nil
}

// waitAcked polls cons until it has delivered every message up to stream
// sequence lastSeq and has none left unacked, and returns its last info.
func waitAcked(ctx context.Context, cons jetstream.Consumer, lastSeq uint64) (*jetstream.ConsumerInfo, error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			return nil, err
		}
		if info.Delivered.Stream >= lastSeq && info.NumPending == 0 && info.NumAckPending == 0 {
			return info, nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// runJetStream is the demo on NATS JetStream at cfg.NATSURL: it publishes
// msgs, every cfg.RetryEvery'th twice as a producer retrying does, and
// consumes them with cfg.Workers workers until every copy is acked.
func runJetStream(ctx context.Context, cfg demoConfig, runID string, msgs []Message, consumer *Consumer) (BrokerStats, error) {
	nc, err := nats.Connect(cfg.NATSURL)
	if err != nil {
		return BrokerStats{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return BrokerStats{}, err
	}
	subject, name := natsSubject+"."+runID, cfg.Group+"-"+runID
	cons, err := jetStreamQueue(ctx, js, name, subject, cfg.AckWait)
	if err != nil {
		return BrokerStats{}, err
	}
	defer js.DeleteConsumer(context.WithoutCancel(ctx), natsStream, name)

	var pubs []Message
	for i, m := range msgs {
		pubs = append(pubs, m)
		if every(cfg.RetryEvery, i) {
			pubs = append(pubs, m) // the producer got no ack in time and published again
		}
	}
	lastSeq, err := publishJetStream(ctx, js, subject, pubs)
	if err != nil {
		return BrokerStats{}, err
	}

	workCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Go(func() {
			if err := consumer.ConsumeJetStream(workCtx, cons); err != nil {
				stop(err)
			}
		})
	}
	info, err := waitAcked(workCtx, cons, lastSeq)
	if cause := context.Cause(workCtx); cause != nil {
		err = cause // a worker's error, or ctx's
	}
	stop(nil)
	wg.Wait()
	if err != nil {
		return BrokerStats{}, err
	}
	delivered := int(info.Delivered.Consumer)
	return BrokerStats{Published: len(msgs), Copies: len(pubs), Delivered: delivered, Redelivered: delivered - len(pubs)}, nil
}
