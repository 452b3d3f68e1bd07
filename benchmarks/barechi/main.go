// SPDX-License-Identifier: Apache-2.0

// Command barechi is the baseline that idemsvc's HTTP throughput is compared
// against: a bare chi router whose POST /v1/begin and POST /v1/complete read
// the JSON body's key (and lease token and response) and run the same
// single script, with the same KEYS and ARGV, as idemsvc's Redis store,
// then write a minimal JSON reply; a begin of a completed key answers its
// stored response. It has no authentication, no logging, no metrics and no
// validation: the gap between it and idemsvc is the cost of those layers.
//
//	barechi --listen 127.0.0.1:8081 --redis-url redis://127.0.0.1:6379
//
// Every call acts for the tenant "bench".
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idemsvc/idemsvc/internal/lua"
	"github.com/idemsvc/idemsvc/internal/redisstore"
)

const (
	tenant       = "bench"
	leaseMs      = 30_000 // idemsvc's default lease
	retentionS   = 86_400 // and retention
	storeTimeout = time.Second
	maxBody      = 2 << 20
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "barechi:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("barechi", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8081", "address to serve on")
	redisURL := fs.String("redis-url", "redis://127.0.0.1:6379", "Redis to run the script on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	opts, err := redis.ParseURL(*redisURL)
	if err != nil {
		return fmt.Errorf("--redis-url: %w", err)
	}
	opts.ContextTimeoutEnabled = true // as idemsvc's client
	client := redis.NewClient(opts)
	defer client.Close()

	r := chi.NewRouter()
	r.Post("/v1/begin", func(w http.ResponseWriter, r *http.Request) { begin(w, r, client) })
	r.Post("/v1/complete", func(w http.ResponseWriter, r *http.Request) { complete(w, r, client) })
	return http.ListenAndServe(*listen, r)
}

// begin does what idemsvc's begin does in Redis, and little else.
func begin(w http.ResponseWriter, r *http.Request, client *redis.Client) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req.Key == "" {
		http.Error(w, "want a JSON body with a key", http.StatusBadRequest)
		return
	}
	var token [16]byte
	rand.Read(token[:])
	ctx, cancel := context.WithTimeout(r.Context(), storeTimeout)
	defer cancel()
	// KEYS and ARGV as redisstore.Store.Begin passes them, without
	// owner or fingerprint.
	res, err := lua.Begin.Run(ctx, client, []string{redisstore.Key(tenant, req.Key)},
		string(token[:]), "", "", int64(leaseMs), int64(retentionS), req.Key).Slice()
	if err == nil && len(res) < 2 {
		err = errors.New("short script reply")
	}
	if err != nil {
		http.Error(w, "store: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	code, _ := res[0].(int64)
	w.Header().Set("Content-Type", "application/json")
	switch code {
	case 0: // acquired
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"status":"acquired","key":`+strconv.Quote(req.Key)+`,"lease_token":"`+hex.EncodeToString(token[:])+`"}`)
	case 1: // in progress elsewhere
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, `{"status":"in_progress"}`)
	case 2: // finished: replay
		raw, _ := res[2].(string)
		_, _ = io.WriteString(w, `{"status":"completed","response":`+storedResponse(raw)+`}`)
	default:
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"status":"rejected","code":`+strconv.FormatInt(code, 10)+`}`)
	}
}

// complete does what idemsvc's complete does in Redis, and little else: the
// response is stored as the JSON the request gave.
func complete(w http.ResponseWriter, r *http.Request, client *redis.Client) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req struct {
		Key        string          `json:"key"`
		LeaseToken string          `json:"lease_token"`
		Response   json.RawMessage `json:"response"`
	}
	token, terr := []byte(nil), errors.New("no lease token")
	if err = json.Unmarshal(body, &req); err == nil {
		token, terr = hex.DecodeString(req.LeaseToken)
	}
	if err != nil || terr != nil || req.Key == "" {
		http.Error(w, "want a JSON body with a key and a lease token", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), storeTimeout)
	defer cancel()
	res, err := lua.Complete.Run(ctx, client, []string{redisstore.Key(tenant, req.Key)},
		string(token), string(req.Response), "").Slice()
	if err == nil && len(res) < 1 {
		err = errors.New("short script reply")
	}
	if err != nil {
		http.Error(w, "store: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if code, _ := res[0].(int64); code != 0 {
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, `{"status":"rejected","code":`+strconv.FormatInt(code, 10)+`}`)
		return
	}
	_, _ = io.WriteString(w, `{"status":"completed","key":`+strconv.Quote(req.Key)+`}`)
}

// storedResponse is the response at the end of a record (the layout in
// internal/lua/record.lua): past the fixed fields, three strings with a
// 2-byte length and one with a 4-byte length. "null" when there is none.
func storedResponse(raw string) string {
	at := 68
	for range 3 {
		if len(raw) < at+2 {
			return "null"
		}
		at += 2 + (int(raw[at])<<8 | int(raw[at+1]))
	}
	if len(raw) < at+4 {
		return "null"
	}
	at += 4 + (int(raw[at])<<24 | int(raw[at+1])<<16 | int(raw[at+2])<<8 | int(raw[at+3]))
	if len(raw) <= at {
		return "null"
	}
	return raw[at:]
}
