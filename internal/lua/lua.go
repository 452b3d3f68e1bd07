// Package lua holds the Redis scripts that make up idemsvc's state machine.
//
// Each transition is one .lua file that opens with its contract (KEYS, ARGV,
// reply). record.lua, the record codec, is prepended to each of them. Every
// script touches only KEYS[1] and reads the time from Redis.
package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

//go:embed record.lua
var record string

//go:embed begin.lua
var begin string

//go:embed complete.lua
var complete string

//go:embed fail.lua
var fail string

//go:embed extend.lua
var extend string

//go:embed status.lua
var status string

//go:embed stored_bytes.lua
var storedBytes string

//go:embed waiter.lua
var waiter string

// The scripts, ready for EVALSHA. Script.Run falls back to EVAL on NOSCRIPT.
var (
	Begin    = redis.NewScript(record + begin)
	Complete = redis.NewScript(record + complete)
	Fail     = redis.NewScript(record + fail)
	Extend   = redis.NewScript(record + extend)
	Status   = redis.NewScript(record + status)
)

// The scripts of tenant limits (internal/quota), which use no record.
var (
	StoredBytes = redis.NewScript(storedBytes)
	Waiter      = redis.NewScript(waiter)
)
