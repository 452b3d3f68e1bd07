// SPDX-License-Identifier: Apache-2.0

package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	idem "github.com/idemsvc/idemsvc/clients/go"
)

func ExampleNew() {
	client, err := idem.New("https://idemsvc.internal:8443",
		idem.WithAPIKey(os.Getenv("IDEMSVC_API_KEY")),
		idem.WithTLSFiles("/etc/idemsvc/ca.crt", "", ""), // a private CA; no client certificate
		idem.WithRetryBudget(5*time.Second),
	)
	if err != nil {
		log.Fatal(err)
	}
	_ = client
}

func ExampleClient_Do() {
	client, err := idem.New("http://127.0.0.1:8080")
	if err != nil {
		log.Fatal(err)
	}
	// A message delivered twice charges the card once: the second delivery
	// gets the first one's stored response.
	res, err := client.Do(context.Background(), "order-42/charge", idem.DoOptions{}, func(ctx context.Context) (idem.Response, error) {
		// charge the card here; return idem.Terminal(err) for a failure
		// that no retry can fix
		return idem.Response{StatusCode: 201, Body: []byte(`{"charge":"ch_1"}`)}, nil
	})
	switch {
	case errors.Is(err, idem.ErrUnavailable):
		log.Print("idemsvc is unavailable: leave the message for redelivery")
	case err != nil:
		log.Print(err)
	default:
		fmt.Printf("%d %s replayed=%v\n", res.Response.StatusCode, res.Response.Body, res.Replayed)
	}
}

func ExampleMiddleware() {
	client, err := idem.New("http://127.0.0.1:8080", idem.WithAPIKey(os.Getenv("IDEMSVC_API_KEY")))
	if err != nil {
		log.Fatal(err)
	}
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	// POST and PATCH requests carrying Idempotency-Key run once per key;
	// their retries get the stored answer with Idempotent-Replayed: true.
	http.Handle("POST /orders", idem.Middleware(client, idem.MiddlewareOptions{})(createOrder))
	log.Fatal(http.ListenAndServe(":8000", nil))
}
