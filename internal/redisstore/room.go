// SPDX-License-Identifier: Apache-2.0

package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/idemsvc/idemsvc/internal/statemachine"

	"github.com/redis/go-redis/v9"
)

// Room for outcomes.
//
// Under noeviction, a master with maxmemory refuses a write that may grow
// memory once what it counts is over maxmemory, and a large write's own
// bytes count while it arrives: a nearly full master still takes a begin
// but refuses the complete that follows. The caller's operation ran, its
// outcome is lost, the lease runs out and a retry runs the operation
// again. So the store keeps a reserve: while a master's free memory under
// maxmemory is under Options.ReserveBytes, a begin that would start an
// attempt on a key of that master fails with ErrNoRoom, and the attempts
// already running have the reserve for their outcomes. A master whose
// eviction policy may drop records (without AllowEviction) refuses begins
// the same way, with ErrEvicting. Replays, completes, fails and extends go
// on.
//
// RefreshRoom reads every master (INFO memory, one round trip each) and
// sets the gates; its caller runs it every second or so. A begin reads the
// gates with one atomic load, and only while a gate is shut finds its
// key's master, in a Cluster from the client's slot map in memory
// (MasterForKey, no round trip). A shut gate makes the begin's script
// acquire nothing, as NoAcquire does: it still replays a finished record,
// in the one round trip of every begin.

// DefaultReserveBytes is Options.ReserveBytes's default: room for the
// outcomes of about 50 attempts in flight on one master that each store
// the largest response (1 MiB), or some 3,000 of 16 KiB. A complete of n
// bytes needs 1.0–1.3 × n free under maxmemory, as TestOutcomeHeadroom
// measures: its arguments count while they arrive, then the record stays.
const DefaultReserveBytes = 64 << 20

// Room is one master's memory as RefreshRoom read it.
type Room struct {
	Node string // host:port, as /readyz names it
	// Err is why the node could not be read; its gate stays as it was.
	Err    error
	Memory Memory
	// Refusal is why begins that would acquire on the node are refused
	// (ErrNoRoom or ErrEvicting, with detail), or nil.
	Refusal error
}

// gates are the masters that refuse new attempts; a Store holds nil
// while none does.
type gates struct {
	all    error            // outside a Cluster: the one master's refusal
	byAddr map[string]error // in a Cluster: by the address the client knows each master by
}

// roomState is what RefreshRoom keeps between runs.
type roomState struct {
	mu     sync.Mutex             // held by RefreshRoom: one at a time
	last   atomic.Pointer[[]Room] // for Rooms
	byAddr map[string]error       // the Cluster's gates, kept for masters not read
}

// refusal is why a begin on key may not acquire: nil, at the cost of one
// atomic load, while every master may take new attempts.
func (s *Store) refusal(ctx context.Context, key string) error {
	g := s.gates.Load()
	if g == nil {
		return nil
	}
	if g.byAddr == nil {
		return g.all
	}
	master, err := s.client.(*redis.ClusterClient).MasterForKey(ctx, key)
	if err != nil {
		return nil // the script's own call finds the master, or fails
	}
	return g.byAddr[master.Options().Addr]
}

// RefreshRoom reads the memory of every master and sets which of them
// refuse new attempts: those with less free memory under maxmemory than
// the reserve, and those whose eviction policy may drop records unless
// eviction is allowed. A master that does not answer keeps its gate as it
// was; one that hides INFO has none. It returns what it read, also kept
// for Rooms.
func (s *Store) RefreshRoom(ctx context.Context) []Room {
	s.room.mu.Lock() // one refresh at a time
	defer s.room.mu.Unlock()
	var rooms []Room
	if c, ok := s.client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		byAddr := make(map[string]error)
		err := c.ForEachMaster(ctx, func(ctx context.Context, shard *redis.Client) error {
			addr := shard.Options().Addr
			r := s.readRoom(ctx, shard, addr)
			if r.Err != nil {
				r.Refusal = s.room.byAddr[addr] // as it was
			}
			mu.Lock()
			defer mu.Unlock()
			rooms = append(rooms, r)
			if r.Refusal != nil {
				byAddr[addr] = r.Refusal
			}
			return nil
		})
		if err != nil && len(rooms) == 0 { // the slot map could not be read: gates as they were
			return s.keepRooms([]Room{{Node: strings.Join(c.Options().Addrs, ","), Err: err}}, nil, true)
		}
		s.room.byAddr = byAddr
		var g *gates
		if len(byAddr) > 0 {
			g = &gates{byAddr: byAddr}
		}
		return s.keepRooms(rooms, g, false)
	}
	addr := ""
	if c, ok := s.client.(*redis.Client); ok {
		addr = c.Options().Addr
	}
	r := s.readRoom(ctx, s.client, addr)
	if r.Err != nil {
		if g := s.gates.Load(); g != nil {
			r.Refusal = g.all // as it was
		}
		return s.keepRooms([]Room{r}, nil, true)
	}
	var g *gates
	if r.Refusal != nil {
		g = &gates{all: r.Refusal}
	}
	return s.keepRooms([]Room{r}, g, false)
}

// keepRooms keeps rooms for Rooms, sorted by node, and g as the gates
// unless keepGates.
func (s *Store) keepRooms(rooms []Room, g *gates, keepGates bool) []Room {
	slices.SortFunc(rooms, func(a, b Room) int { return strings.Compare(a.Node, b.Node) })
	s.room.last.Store(&rooms)
	if !keepGates {
		s.gates.Store(g)
	}
	return rooms
}

// Rooms is what the last RefreshRoom read.
func (s *Store) Rooms() []Room {
	if last := s.room.last.Load(); last != nil {
		return slices.Clone(*last)
	}
	return nil
}

// readRoom reads one master's memory (INFO memory and CLIENT INFO, for its
// own address, in one round trip) and says whether it refuses new attempts.
func (s *Store) readRoom(ctx context.Context, node redis.Cmdable, addr string) Room {
	var info *redis.StringCmd
	var client *redis.ClientInfoCmd
	_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
		info = p.Info(ctx, "memory")
		client = p.ClientInfo(ctx)
		return nil
	})
	r := Room{Node: addr}
	if c := client.Val(); client.Err() == nil && c != nil && c.LAddr != "" {
		r.Node = c.LAddr
	}
	if err := info.Err(); err != nil {
		if !isReplyError(err) {
			r.Err = err // no answer
		}
		return r // INFO hidden or refused: nothing known, no gate
	}
	r.Memory = memoryOf(info.Val())
	switch m := r.Memory; {
	case m.Evicting() && !s.allowEviction:
		r.Refusal = fmt.Errorf("%w: %s has maxmemory-policy %s", statemachine.ErrEvicting, r.Node, m.Policy)
	case m.Short(s.reserve):
		r.Refusal = fmt.Errorf("%w: %s has %d bytes free under maxmemory, under the reserve of %d",
			statemachine.ErrNoRoom, r.Node, max(m.Headroom(), 0), s.reserve)
	}
	return r
}
