// SPDX-License-Identifier: Apache-2.0

// Command payments-api is a small payment API made idempotent by idemsvc:
// a client that retries POST /charges with the same Idempotency-Key header
// creates one charge, and every retry gets the first response again, byte
// for byte, marked "Idempotent-Replayed: true".
//
// The charge handler knows nothing about idempotency; one line in
// newServer wraps it in idem.Middleware.
//
// Usage:
//
//	IDEMSVC_URL=http://127.0.0.1:8080 go run ./examples/payments-api --listen :8081
//
// Configuration: IDEMSVC_URL (default http://127.0.0.1:8080) and
// IDEMSVC_API_KEY name the idemsvc to use; --listen or PAYMENTS_LISTEN
// (default :8081) the address to serve on.
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
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Environ(), os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		log.Fatalf("payments-api: %v", err)
	}
}

// run serves the API until ctx ends.
func run(ctx context.Context, args, env []string, stderr io.Writer) error {
	vars := make(map[string]string)
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	listen := ":8081"
	if v := vars["PAYMENTS_LISTEN"]; v != "" {
		listen = v
	}
	idemURL := "http://127.0.0.1:8080"
	if v := vars["IDEMSVC_URL"]; v != "" {
		idemURL = v
	}
	fs := flag.NewFlagSet("payments-api", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&listen, "listen", listen, "address to serve on (PAYMENTS_LISTEN)")
	fs.StringVar(&idemURL, "idemsvc-url", idemURL, "idemsvc's base URL (IDEMSVC_URL)")
	if err := fs.Parse(args); err != nil {
		return err
	}

	client, err := idem.New(idemURL, idem.WithAPIKey(vars["IDEMSVC_API_KEY"]))
	if err != nil {
		return err
	}
	srv := &http.Server{
		Addr:              listen,
		Handler:           newServer(client, newLedger()),
		ReadHeaderTimeout: 5 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	fmt.Fprintf(stderr, "payments-api: serving on %s, idempotent through idemsvc at %s\n", listen, idemURL)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdownCtx)
}

// newServer is the payment API, made idempotent: a POST needs an
// Idempotency-Key header, and a duplicate of a request still running waits
// up to 5 s for its response instead of getting 409.
func newServer(client *idem.Client, l *ledger) http.Handler {
	return idem.Middleware(client, idem.MiddlewareOptions{Wait: 5 * time.Second})(newAPI(l))
}

// newAPI is the payment API without idempotency:
//
//	POST /charges       {"amount": 1000, "currency": "eur", "description": "..."} -> 201 the charge
//	GET  /charges       -> 200 every charge
//	GET  /charges/{id}  -> 200 the charge, 404 when there is none
func newAPI(l *ledger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		var req chargeRequest
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, "the body is not a charge: "+err.Error())
			return
		}
		if err := req.validate(); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		c := l.create(req)
		w.Header().Set("Location", "/charges/"+c.ID)
		writeJSON(w, http.StatusCreated, c)
	})
	mux.HandleFunc("GET /charges", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, l.list())
	})
	mux.HandleFunc("GET /charges/{id}", func(w http.ResponseWriter, r *http.Request) {
		c, ok := l.get(r.PathValue("id"))
		if !ok {
			writeError(w, http.StatusNotFound, "no such charge")
			return
		}
		writeJSON(w, http.StatusOK, c)
	})
	return mux
}

// chargeRequest is the body of POST /charges.
type chargeRequest struct {
	Amount      int64  `json:"amount"`   // in the currency's minor unit
	Currency    string `json:"currency"` // ISO 4217, lower case
	Description string `json:"description,omitempty"`
}

func (r chargeRequest) validate() error {
	if r.Amount <= 0 {
		return errors.New("amount must be a positive number of minor units")
	}
	if len(r.Currency) != 3 || strings.Trim(r.Currency, "abcdefghijklmnopqrstuvwxyz") != "" {
		return errors.New("currency must be three lower-case letters")
	}
	return nil
}

// Charge is a created charge.
type Charge struct {
	ID          string    `json:"id"`
	Amount      int64     `json:"amount"`
	Currency    string    `json:"currency"`
	Description string    `json:"description,omitempty"`
	Created     time.Time `json:"created"`
}

// ledger keeps the charges in memory; a real service would write them to
// its database.
type ledger struct {
	mu      sync.Mutex
	charges []Charge
}

func newLedger() *ledger { return &ledger{} }

func (l *ledger) create(req chargeRequest) Charge {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail
	c := Charge{ID: "ch_" + hex.EncodeToString(b[:]), Amount: req.Amount, Currency: req.Currency,
		Description: req.Description, Created: time.Now().UTC().Truncate(time.Millisecond)}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.charges = append(l.charges, c)
	return c
}

func (l *ledger) get(id string) (Charge, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.charges {
		if c.ID == id {
			return c, true
		}
	}
	return Charge{}, false
}

func (l *ledger) list() []Charge {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Charge{}, l.charges...)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}
