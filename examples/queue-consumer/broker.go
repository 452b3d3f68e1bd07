// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"math/rand/v2"
)

// Message is what a producer publishes. ID is the producer's id of the
// message: every delivery of the message carries the same one, which makes
// it the idempotency key.
type Message struct {
	ID   string
	Body []byte
}

// Broker is an in-process stand-in for an at-least-once broker (NATS
// JetStream, RabbitMQ, SQS, Kafka...), built on a channel. It delivers every
// message more than once on purpose, as real brokers do after a lost ack,
// a consumer crash or a rebalance, interleaving the copies so that
// duplicates reach concurrent workers; and it delivers again whatever is
// nacked. Deliveries closes once every delivery has been acked, or ctx ends.
type Broker struct {
	deliveries chan Delivery
	settled    chan settlement
	done       chan struct{}
	stats      BrokerStats // owned by loop until done is closed
}

// BrokerStats count what a broker did: the channel Broker, or JetStream.
type BrokerStats struct {
	Published   int // messages
	Copies      int // deliveries planned: each message 2 or 3 times (JetStream: the stream's messages, producer retries included)
	Delivered   int // deliveries made, redeliveries included
	Redelivered int // deliveries again of a nacked delivery (JetStream: or of one unacked after AckWait)
}

type settlement struct {
	m       Message
	requeue bool
}

// NewBroker starts a broker that delivers every message of msgs two or
// three times, in an order shuffled by seed, until every delivery is acked
// or ctx ends.
func NewBroker(ctx context.Context, msgs []Message, seed uint64) *Broker {
	b := &Broker{
		deliveries: make(chan Delivery),
		settled:    make(chan settlement),
		done:       make(chan struct{}),
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var queue []Delivery
	for _, m := range msgs {
		copies := 2 + rng.IntN(2)
		for range copies {
			queue = append(queue, b.delivery(m))
		}
	}
	// Shuffle, but keep some copies side by side, so that duplicates are
	// also handled at the same time by two workers.
	rng.Shuffle(len(queue), func(i, j int) {
		if rng.IntN(4) != 0 {
			queue[i], queue[j] = queue[j], queue[i]
		}
	})
	b.stats = BrokerStats{Published: len(msgs), Copies: len(queue)}
	go b.loop(ctx, queue)
	return b
}

// Deliveries is the channel consumers receive from.
func (b *Broker) Deliveries() <-chan Delivery { return b.deliveries }

// Stats returns the broker's counts once every delivery has been acked (or
// its context ended).
func (b *Broker) Stats() BrokerStats {
	<-b.done
	return b.stats
}

// loop hands out the queue and takes settlements until every delivery is
// acked. The queue is unbounded, so that a nack never blocks a worker.
func (b *Broker) loop(ctx context.Context, queue []Delivery) {
	defer close(b.done)
	defer close(b.deliveries)
	unacked := len(queue)
	for unacked > 0 {
		var out chan<- Delivery
		var next Delivery
		if len(queue) > 0 {
			out, next = b.deliveries, queue[0]
		}
		select {
		case out <- next:
			queue = queue[1:]
			b.stats.Delivered++
		case s := <-b.settled:
			if s.requeue {
				queue = append(queue, b.delivery(s.m))
				b.stats.Redelivered++
			} else {
				unacked--
			}
		case <-ctx.Done():
			return
		}
	}
}

// delivery is a delivery of m, settled by telling loop.
func (b *Broker) delivery(m Message) Delivery {
	return Delivery{Message: m, Ack: func() { b.settle(m, false) }, Nack: func() { b.settle(m, true) }}
}

func (b *Broker) settle(m Message, requeue bool) {
	select {
	case b.settled <- settlement{m, requeue}:
	case <-b.done: // every delivery was acked already, or the broker stopped
	}
}
