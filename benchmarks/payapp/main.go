// SPDX-License-Identifier: Apache-2.0

// Command payapp is the application of the caller's-path benchmark: a tiny
// net/http service whose POST /pay answers 201 with a 24-byte JSON body,
// served alone, or behind the Go SDK's idem.Middleware when --idemsvc is
// given, with the SDK's defaults (idem.New without options but the API
// key), as a service following the README would run it.
//
//	payapp --listen 127.0.0.1:8090                               # alone
//	payapp --listen 127.0.0.1:8091 --idemsvc http://127.0.0.1:8080 # behind the middleware
//
// The API key comes from IDEMSVC_API_KEY.
package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"

	idem "github.com/idemsvc/idemsvc/clients/go"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "payapp:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("payapp", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8090", "address to serve on")
	idemsvcURL := fs.String("idemsvc", "", "idemsvc's URL: serve /pay behind idem.Middleware (default: alone)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var h http.Handler = http.HandlerFunc(pay)
	if *idemsvcURL != "" {
		c, err := idem.New(*idemsvcURL, idem.WithAPIKey(os.Getenv("IDEMSVC_API_KEY")))
		if err != nil {
			return err
		}
		h = idem.Middleware(c, idem.MiddlewareOptions{})(h)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /pay", h)
	mux.HandleFunc("GET /", func(http.ResponseWriter, *http.Request) {}) // ready
	return http.ListenAndServe(*listen, mux)
}

// pay reads the request and accepts the payment.
func pay(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"payment":"accepted"}`+"\n\n")
}
