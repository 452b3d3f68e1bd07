// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"sync/atomic"

	idem "github.com/idemsvc/idemsvc/clients/go"
)

// Consumer handles each message at most once, however often the broker
// delivers it and however many workers run: every delivery goes through
// idem.Do with the message's id as the idempotency key.
//
//   - The first delivery to get the key runs Handle; a copy delivered to
//     another worker meanwhile waits for it and gets its outcome.
//   - A later copy replays the stored outcome without running Handle.
//   - A Handle error releases the key, and the delivery is nacked: the
//     broker delivers it again and the next copy runs Handle again.
//   - A Handle error marked with idem.Terminal (a poison message) is
//     stored: the delivery and every later copy are acked without running
//     Handle again, where a real consumer would dead-letter them.
//
// Handle must do its side effect only when it returns no error: a
// retryable error means "nothing happened, run me again".
//
// Consume takes deliveries from a channel (the in-process Broker);
// ConsumeJetStream pulls them from NATS JetStream (jetstream.go). Both
// settle each delivery the same way, in handle.
type Consumer struct {
	Client *idem.Client
	// Group names the consumer: keys are Group + ":" + message id, so that
	// two different consumers of one message each handle it once.
	Group string
	// Handle does the message's side effect and returns a result to store
	// (replayed to duplicates; nil stores none).
	Handle func(ctx context.Context, m Message) ([]byte, error)
	// Options are Do's options: lease, retention, wait.
	Options idem.DoOptions

	// dieBeforeAck, for the demo, simulates a worker that dies after Do
	// returned and before its ack reached the broker: when it returns true
	// the delivery is left unsettled, for the broker to deliver it again
	// once its ack deadline passes. Only a broker with one (JetStream's
	// AckWait) ever does.
	dieBeforeAck func(Message) bool

	processed, replayed, deadLettered, nacked, died atomic.Int64
}

// Delivery is one delivery of a message, to be settled with Ack (done) or
// Nack (deliver it again).
type Delivery struct {
	Message
	Ack, Nack func()
}

// ConsumerStats count what the consumer did with its deliveries.
type ConsumerStats struct {
	Processed    int64 // Handle ran and succeeded: acked
	Replayed     int64 // duplicates of a processed message: acked without running Handle
	DeadLettered int64 // terminal failures, first or replayed: acked
	Nacked       int64 // retryable failures: handed back to the broker
	Died         int64 // of the acks, those lost to a worker dying first (demo)
}

// Consume handles deliveries until the channel is closed.
func (c *Consumer) Consume(ctx context.Context, deliveries <-chan Delivery) {
	for d := range deliveries {
		c.handle(ctx, d)
	}
}

func (c *Consumer) handle(ctx context.Context, d Delivery) {
	res, err := c.Client.Do(ctx, c.Group+":"+d.ID, c.Options, func(ctx context.Context) (idem.Response, error) {
		out, err := c.Handle(ctx, d.Message)
		return idem.Response{Body: out}, err
	})
	ack := func(n *atomic.Int64) {
		n.Add(1)
		if c.dieBeforeAck != nil && c.dieBeforeAck(d.Message) {
			c.died.Add(1)
			return
		}
		d.Ack()
	}
	switch {
	case err == nil && res.Replayed:
		ack(&c.replayed)
	case err == nil:
		ack(&c.processed)
	case errors.Is(err, idem.ErrFailed):
		ack(&c.deadLettered)
	default:
		// Handle failed retryably, or idemsvc could not be reached: nothing
		// ran for good, so let the broker deliver the message again.
		c.nacked.Add(1)
		d.Nack()
	}
}

// Stats returns the consumer's counts so far.
func (c *Consumer) Stats() ConsumerStats {
	return ConsumerStats{Processed: c.processed.Load(), Replayed: c.replayed.Load(),
		DeadLettered: c.deadLettered.Load(), Nacked: c.nacked.Load(), Died: c.died.Load()}
}
