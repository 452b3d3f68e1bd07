// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/idemsvc/idemsvc/internal/statemachine"

	"github.com/redis/go-redis/v9"
)

// Watch implements Watcher: the scripts that end an attempt publish it on
// the record's channel (internal/lua/record.lua, announce), and the store
// subscribes to the channels of the keys watched in this process.
func (s *Store) Watch(tenant, key string) *statemachine.Watch {
	return s.watch.watch(Key(tenant, key) + endSuffix)
}

var _ statemachine.Watcher = (*Store)(nil)

// endSuffix makes a record's channel from its key (record.lua's announce):
// the same hash tag, so the same slot.
const endSuffix = ":end"

const (
	// subscribeTimeout bounds one SUBSCRIBE or UNSUBSCRIBE written.
	subscribeTimeout = time.Second
	// checkInterval is how often a silent subscription connection is
	// checked against the slot map.
	checkInterval = time.Second
	// pingAfter is how many silent intervals pass before a PING checks the
	// connection; as many more without an answer drop it, and its channels
	// are subscribed anew.
	pingAfter = 5
)

// redisWatcher keeps one pub/sub connection per master that holds a
// watched key (one in all outside a Cluster), subscribed to the channels of
// the keys watched in this process. A key costs Redis one SUBSCRIBE when
// its first watch starts and one UNSUBSCRIBE when its last one stops, and
// nothing in between. In a Cluster the channels are sharded (SSUBSCRIBE on
// the slot's master), since a plain PUBLISH would reach every node.
//
// After a lost connection, a failover or a slot that moved, the channels
// are subscribed again on the node that now serves them, and their watches
// are told that they may have missed news. The channel of each key is
// subscribed on its own (SSUBSCRIBE of one channel), because one SSUBSCRIBE
// must not span slots; for the same reason a connection that go-redis
// reconnected by itself (it resubscribes every channel in one command) is
// dropped and replaced.
type redisWatcher struct {
	client  redis.UniversalClient
	cluster *redis.ClusterClient // nil outside a Cluster

	mu        sync.Mutex
	watches   statemachine.WatchSet[string] // by channel
	subs      map[string]*subConn           // by channel: the connection subscribed to it
	conns     map[string]*subConn           // by master address ("" outside a Cluster)
	repairing bool                          // a repair goroutine is running
}

// subConn is one pub/sub connection and the channels it holds.
type subConn struct {
	addr     string
	ps       *redis.PubSub
	channels map[string]bool // true once Redis confirmed the subscription
	leaving  map[string]int  // unsubscribes whose confirmation is due
}

func newRedisWatcher(client redis.UniversalClient) *redisWatcher {
	rw := &redisWatcher{client: client, watches: make(statemachine.WatchSet[string]),
		subs: make(map[string]*subConn), conns: make(map[string]*subConn)}
	rw.cluster, _ = client.(*redis.ClusterClient)
	return rw
}

func (rw *redisWatcher) watch(channel string) *statemachine.Watch {
	w := statemachine.NewWatch(func(w *statemachine.Watch) { rw.unwatch(channel, w) })
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.watches.Add(channel, w) {
		if err := rw.subscribe(channel); err != nil {
			w.SignalMissed()
			rw.repair()
		}
		return w // the subscription's confirmation signals Missed
	}
	if c := rw.subs[channel]; c == nil || c.channels[channel] {
		w.SignalMissed() // in force already, or not subscribed for now
	}
	return w
}

func (rw *redisWatcher) unwatch(channel string, w *statemachine.Watch) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if !rw.watches.Remove(channel, w) {
		return
	}
	c := rw.subs[channel]
	if c == nil {
		return
	}
	delete(rw.subs, channel)
	delete(c.channels, channel)
	if len(c.channels) == 0 {
		rw.closeConn(c)
		return
	}
	c.leaving[channel]++
	ctx, cancel := context.WithTimeout(context.Background(), subscribeTimeout)
	defer cancel()
	var err error
	if rw.cluster != nil {
		err = c.ps.SUnsubscribe(ctx, channel)
	} else {
		err = c.ps.Unsubscribe(ctx, channel)
	}
	if err != nil {
		rw.lost(c)
	}
}

// subscribe subscribes channel on the connection to its master, opening
// it if need be. The caller holds mu.
func (rw *redisWatcher) subscribe(channel string) error {
	ctx, cancel := context.WithTimeout(context.Background(), subscribeTimeout)
	defer cancel()
	var node redis.UniversalClient = rw.client
	addr := ""
	if rw.cluster != nil {
		master, err := rw.cluster.MasterForKey(ctx, channel)
		if err != nil {
			return err
		}
		node, addr = master, master.Options().Addr
	}
	c := rw.conns[addr]
	if c == nil {
		c = &subConn{addr: addr, channels: make(map[string]bool), leaving: make(map[string]int)}
		if rw.cluster != nil {
			c.ps = node.SSubscribe(ctx)
		} else {
			c.ps = node.Subscribe(ctx)
		}
		rw.conns[addr] = c
		go rw.receive(c)
	}
	var err error
	if rw.cluster != nil {
		err = c.ps.SSubscribe(ctx, channel)
	} else {
		err = c.ps.Subscribe(ctx, channel)
	}
	if err != nil {
		rw.lost(c)
		return err
	}
	c.channels[channel] = false
	rw.subs[channel] = c
	return nil
}

// receive reads c's messages until c is closed or fails. Every silent
// checkInterval it checks, in the client's slot map, that c's master still
// serves c's channels (a master that hangs instead of closing the
// connection is noticed once the client learns of its replacement); after
// pingAfter silent intervals it sends a PING, and drops c if as many more
// pass without an answer.
func (rw *redisWatcher) receive(c *subConn) {
	ctx := context.Background()
	silent := 0
	for {
		msg, err := c.ps.ReceiveTimeout(ctx, checkInterval)
		if err != nil {
			if errors.Is(err, redis.ErrClosed) {
				return // closed by closeConn or lost, or the client closed
			}
			var timeout net.Error
			if !errors.As(err, &timeout) || !timeout.Timeout() || rw.moved(c) || silent == 2*pingAfter {
				rw.mu.Lock()
				rw.lost(c)
				rw.mu.Unlock()
				return
			}
			if silent++; silent == pingAfter {
				pctx, cancel := context.WithTimeout(ctx, subscribeTimeout)
				err = c.ps.Ping(pctx)
				cancel()
				if err != nil {
					silent = 2 * pingAfter // dropped at the next look
				}
			}
			continue
		}
		silent = 0
		switch m := msg.(type) {
		case *redis.Message:
			rw.mu.Lock()
			rw.watches.Ended(m.Channel)
			rw.mu.Unlock()
		case *redis.Subscription:
			rw.confirmed(c, m)
		}
	}
}

// moved reports whether, by the client's slot map, c's channels moved to
// another master.
func (rw *redisWatcher) moved(c *subConn) bool {
	if rw.cluster == nil {
		return false
	}
	rw.mu.Lock()
	var channel string
	for channel = range c.channels {
		break
	}
	rw.mu.Unlock()
	if channel == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), subscribeTimeout)
	defer cancel()
	master, err := rw.cluster.MasterForKey(ctx, channel)
	return err == nil && master.Options().Addr != c.addr
}

// confirmed handles Redis's answer to a subscribe or unsubscribe on c.
func (rw *redisWatcher) confirmed(c *subConn, m *redis.Subscription) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	switch m.Kind {
	case "subscribe", "ssubscribe":
		if rw.subs[m.Channel] == c {
			c.channels[m.Channel] = true
			rw.watches.Missed(m.Channel) // in force: news from before is the watch's to read
		}
	case "unsubscribe", "sunsubscribe":
		if n := c.leaving[m.Channel]; n > 0 {
			if n == 1 {
				delete(c.leaving, m.Channel)
			} else {
				c.leaving[m.Channel] = n - 1
			}
			return
		}
		// Redis dropped the channel itself: its slot moved to another node.
		if rw.subs[m.Channel] == c {
			delete(rw.subs, m.Channel)
			delete(c.channels, m.Channel)
			rw.watches.Missed(m.Channel)
			rw.repair()
		}
	}
}

// lost drops c after a failure: its channels' watches may have missed
// news, and the channels are subscribed again where they now live. The
// caller holds mu.
func (rw *redisWatcher) lost(c *subConn) {
	if rw.conns[c.addr] != c {
		return // dropped already
	}
	for channel := range c.channels {
		if rw.subs[channel] == c {
			delete(rw.subs, channel)
		}
		rw.watches.Missed(channel)
	}
	rw.closeConn(c)
	if len(c.channels) > 0 {
		rw.repair()
	}
}

// closeConn closes c, in the background: closing may wait for go-redis's
// own lock of c. The caller holds mu.
func (rw *redisWatcher) closeConn(c *subConn) {
	if rw.conns[c.addr] == c {
		delete(rw.conns, c.addr)
	}
	go c.ps.Close()
}

// repair starts, unless one runs, a goroutine that subscribes the watched
// channels that are not subscribed, with backoff, until none is left or
// the client is closed. The caller holds mu.
func (rw *redisWatcher) repair() {
	if rw.repairing {
		return
	}
	rw.repairing = true
	go func() {
		for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
			time.Sleep(backoff)
			if rw.cluster != nil {
				rw.cluster.ReloadState(context.Background())
			}
			if rw.repaired() {
				return
			}
		}
	}()
}

// repaired subscribes what it can and reports whether it is done.
func (rw *redisWatcher) repaired() bool {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	done := true
	for channel := range rw.watches {
		if rw.subs[channel] != nil {
			continue
		}
		if err := rw.subscribe(channel); err != nil {
			// The client is closed: nothing to repair. Otherwise the
			// node is not there yet: try again after the backoff.
			done = errors.Is(err, redis.ErrClosed)
			break
		}
	}
	if done {
		rw.repairing = false
	}
	return done
}
