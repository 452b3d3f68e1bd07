// SPDX-License-Identifier: Apache-2.0

package clienttest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/handlers"
	"github.com/idemsvc/idemsvc/internal/statemachine"
)

func ExampleClient_Do() {
	// An idemsvc in process, over an in-memory store, stands in for a real one.
	idemsvc := httptest.NewServer(handlers.New(handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits())}))
	defer idemsvc.Close() // Example functions have no testing.TB for idemtest.Serve

	client, err := idem.New(idemsvc.URL) // add idem.WithAPIKey(key) when idemsvc has tenants
	if err != nil {
		panic(err)
	}
	charge := func(ctx context.Context) (idem.Response, error) {
		fmt.Println("charging the card")
		return idem.Response{StatusCode: 201, Body: []byte(`{"charge":"ch_1"}`)}, nil
	}

	// The same request, twice: the card is charged once, and the second
	// call gets the first one's response.
	for range 2 {
		res, err := client.Do(context.Background(), "order-42/charge", idem.DoOptions{}, charge)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%d %s replayed=%v\n", res.Response.StatusCode, res.Response.Body, res.Replayed)
	}
	// Output:
	// charging the card
	// 201 {"charge":"ch_1"} replayed=false
	// 201 {"charge":"ch_1"} replayed=true
}

func ExampleMiddleware() {
	idemsvc := httptest.NewServer(handlers.New(handlers.Config{Store: statemachine.NewMemoryStore(statemachine.DefaultLimits())}))
	defer idemsvc.Close() // Example functions have no testing.TB for idemtest.Serve
	client, err := idem.New(idemsvc.URL)
	if err != nil {
		panic(err)
	}

	orders := 0
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", orders))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d created\n", orders)
	})
	api := httptest.NewServer(idem.Middleware(client, idem.MiddlewareOptions{})(createOrder))
	defer api.Close()

	// A client retries its POST with the same Idempotency-Key.
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, api.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Idempotency-Key", "4f1c2a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d %s replayed=%q %s", resp.StatusCode, resp.Header.Get("Location"),
			resp.Header.Get("Idempotent-Replayed"), body)
	}
	fmt.Println("orders created:", orders)
	// Output:
	// 201 /orders/1 replayed="" order 1 created
	// 201 /orders/1 replayed="true" order 1 created
	// orders created: 1
}
