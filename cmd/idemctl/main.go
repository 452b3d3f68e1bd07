// SPDX-License-Identifier: Apache-2.0

// Command idemctl is the operator's tool for idemsvc: it finds the keys in
// a state (stuck in progress, say), reads the record of an idempotency key
// and forgets one that is stuck.
//
// Usage:
//
//	idemctl list --state S [--older-than D] [--limit N] [--tenant T] [--json]
//	idemctl status KEY [--tenant T] [--show-response] [--json]
//	idemctl delete KEY [--tenant T] [--json]
//	idemctl usage [--tenant T] [--json]
//	idemctl capacity --rate R --retention D --answer-bytes N [--compressibility C] [...]
//
// Common flags, which may come before or after KEY (use -- before a key
// that starts with "-"):
//
//	--url URL        idemsvc's base URL (IDEMSVC_URL, default http://127.0.0.1:8080)
//	--api-key KEY    API key sent as a bearer token (IDEMSVC_API_KEY)
//	--tenant T       act for tenant T; only an admin key may name another tenant
//	--json           print JSON for scripts instead of aligned "field: value" lines
//	--timeout D      give up after D, retries included (default 15s)
//	--ca-file F      PEM CA that signs idemsvc's certificate (IDEMSVC_CA_FILE; default the system's)
//	--cert-file F    PEM client certificate, for an idemsvc that requires one (IDEMSVC_CLIENT_CERT_FILE)
//	--key-file F     its PEM key (IDEMSVC_CLIENT_KEY_FILE)
//
// list prints the tenant's records in state S (in_progress, completed or
// failed) whose last transition is at least D old, one per line: key,
// attempt, updated_at, and for an attempt in progress its lease's end and
// whether it ran out. --limit stops after N records (default: all). With
// --json it prints one record per line as the API gives it (JSON lines).
//
// status prints the key's record: state, attempt, owner, fingerprint,
// times, and for a failed attempt whether it was retryable and its error.
// With --show-response it also prints the stored response: status code,
// headers and body, the body decoded (a binary body is printed as base64
// and marked as such). With --json it prints the record as the API gives
// it.
//
// delete forgets the key's record, so that the next begin acquires it
// again. It reads the record first and says "deleted: false (no record)"
// for a key with no record, with exit status 3 as status has. With --json
// it prints {"deleted":true,"key":KEY} ("deleted":false when there was no
// record; "tenant" when --tenant is given).
//
// usage prints each tenant's usage against its limits, a line each: begins
// per second over the last minute and the limit rejections (both of the
// instance that answered), stored bytes, waiters and attempts in progress
// (shared), each "/ limit" when the tenant has one. A tenant key sees its
// own tenant; an admin key every tenant, or the one --tenant names. With
// --json it prints one tenant per line as the API gives it.
//
// capacity prints the capacity model of docs/capacity.md for a begin rate,
// a retention and an answer size: bytes per record, Redis memory, masters
// and idemsvc instances, with answers kept as sent, compressed and by
// reference. It talks to no idemsvc; `idemctl capacity -h` lists its flags.
//
// Exit status: 0 when the record was found (status) or deleted (delete),
// 3 when status or delete finds no record for the key, 1 on any error:
// usage errors, and a --tenant that idemsvc's tenants file does not list
// included.
//
// Examples:
//
//	IDEMSVC_URL=http://idemsvc:8080 IDEMSVC_API_KEY=... idemctl status order-42/charge --show-response
//	idemctl status order-42/charge --json | jq -r .state
//	idemctl list --state in_progress --older-than 10m
//	idemctl delete order-42/charge --tenant payments --api-key "$ADMIN_KEY"
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	idem "github.com/idemsvc/idemsvc/clients/go"
	"github.com/idemsvc/idemsvc/internal/buildinfo"
)

// Exit statuses.
const (
	exitOK       = 0
	exitError    = 1
	exitNotFound = 3
)

// Defaults.
const (
	defaultURL     = "http://127.0.0.1:8080"
	defaultTimeout = 15 * time.Second
)

const usage = `usage:
  idemctl list --state S [--older-than D] [--limit N] [--tenant T] [--json]
  idemctl status KEY [--tenant T] [--show-response] [--json]
  idemctl delete KEY [--tenant T] [--json]
  idemctl usage [--tenant T] [--json]
  idemctl capacity --rate R --retention D --answer-bytes N [...]  (idemctl capacity -h)
  idemctl --version

flags (before or after KEY; use -- before a key starting with "-"):
  --url URL        idemsvc's base URL (IDEMSVC_URL, default http://127.0.0.1:8080)
  --api-key KEY    API key sent as a bearer token (IDEMSVC_API_KEY)
  --tenant T       act for tenant T (another tenant needs an admin key)
  --state S        list: in_progress, completed or failed
  --older-than D   list: only records last changed at least D ago (e.g. 10m)
  --limit N        list: print at most N records (default all)
  --show-response  status: also print the stored response, body decoded
  --json           print JSON instead of "field: value" lines
  --timeout D      give up after D, retries included (default 15s)
  --ca-file F      PEM CA of idemsvc's certificate (IDEMSVC_CA_FILE)
  --cert-file F    PEM client certificate (IDEMSVC_CLIENT_CERT_FILE)
  --key-file F     its PEM key (IDEMSVC_CLIENT_KEY_FILE)

exit status: 0 found or deleted, 3 no record for the key (status, delete),
1 error (an unknown --tenant included)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the parsed command line.
type options struct {
	command      string
	key          string
	url          string
	apiKey       string
	tenant       string
	json         bool
	showResponse bool
	timeout      time.Duration
	state        string        // list
	olderThan    time.Duration // list
	limit        int           // list; 0 is all
	caFile       string
	certFile     string
	keyFile      string
}

// run runs idemctl with args (without the program name) and env (KEY=value
// entries, as os.Environ gives them), and returns the exit status.
func run(ctx context.Context, args, env []string, stdout, stderr io.Writer) int {
	if buildinfo.IsVersionFlag(args) {
		fmt.Fprintln(stdout, buildinfo.Line("idemctl"))
		return exitOK
	}
	if len(args) > 0 && args[0] == "capacity" {
		return capacityCmd(args[1:], stdout, stderr)
	}
	opts, err := parseArgs(args, env)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "idemctl: %v\n\n%s", err, usage)
		return exitError
	}

	clientOpts := []idem.Option{idem.WithRetryBudget(opts.timeout)}
	if opts.apiKey != "" {
		clientOpts = append(clientOpts, idem.WithAPIKey(opts.apiKey))
	}
	if opts.tenant != "" {
		clientOpts = append(clientOpts, idem.WithTenant(opts.tenant))
	}
	if opts.caFile != "" || opts.certFile != "" || opts.keyFile != "" {
		clientOpts = append(clientOpts, idem.WithTLSFiles(opts.caFile, opts.certFile, opts.keyFile))
	}
	client, err := idem.New(opts.url, clientOpts...)
	if err != nil {
		fmt.Fprintf(stderr, "idemctl: %v\n", err)
		return exitError
	}
	ctx, cancel := context.WithTimeout(ctx, opts.timeout)
	defer cancel()

	switch opts.command {
	case "list":
		return list(ctx, client, opts, stdout, stderr)
	case "status":
		return status(ctx, client, opts, stdout, stderr)
	case "usage":
		return usageOf(ctx, client, opts, stdout, stderr)
	default: // "delete"; parseArgs accepts no other command
		return deleteKey(ctx, client, opts, stdout, stderr)
	}
}

// parseArgs reads the command, the key and the flags, which may come in any
// order; env gives the defaults of --url and --api-key.
func parseArgs(args, env []string) (options, error) {
	vars := make(map[string]string)
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	opts := options{url: defaultURL, apiKey: vars["IDEMSVC_API_KEY"], timeout: defaultTimeout,
		caFile: vars["IDEMSVC_CA_FILE"], certFile: vars["IDEMSVC_CLIENT_CERT_FILE"], keyFile: vars["IDEMSVC_CLIENT_KEY_FILE"]}
	if v := vars["IDEMSVC_URL"]; v != "" {
		opts.url = v
	}

	fs := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&opts.url, "url", opts.url, "")
	fs.StringVar(&opts.apiKey, "api-key", opts.apiKey, "")
	fs.StringVar(&opts.tenant, "tenant", "", "")
	fs.BoolVar(&opts.json, "json", false, "")
	fs.BoolVar(&opts.showResponse, "show-response", false, "")
	fs.DurationVar(&opts.timeout, "timeout", opts.timeout, "")
	fs.StringVar(&opts.state, "state", "", "")
	fs.DurationVar(&opts.olderThan, "older-than", 0, "")
	fs.IntVar(&opts.limit, "limit", 0, "")
	fs.StringVar(&opts.caFile, "ca-file", opts.caFile, "")
	fs.StringVar(&opts.certFile, "cert-file", opts.certFile, "")
	fs.StringVar(&opts.keyFile, "key-file", opts.keyFile, "")

	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return opts, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if consumed := args[:len(args)-len(rest)]; len(consumed) > 0 && consumed[len(consumed)-1] == "--" {
			positional = append(positional, rest...) // everything after -- is an argument
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}

	if len(positional) == 0 {
		return opts, errors.New("no command given")
	}
	opts.command = positional[0]
	switch opts.command {
	case "help":
		return opts, flag.ErrHelp
	case "status", "delete", "list", "usage":
	default:
		return opts, fmt.Errorf("unknown command %q", opts.command)
	}
	if opts.command == "list" {
		return opts, checkList(opts, positional[1:])
	}
	if opts.command == "usage" {
		return opts, checkUsage(opts, positional[1:])
	}
	if opts.state != "" || opts.olderThan != 0 || opts.limit != 0 {
		return opts, fmt.Errorf("%s: --state, --older-than and --limit are flags of list", opts.command)
	}
	switch len(positional) {
	case 1:
		return opts, fmt.Errorf("%s: no KEY given", opts.command)
	case 2:
		opts.key = positional[1]
	default:
		return opts, fmt.Errorf("%s: one KEY only, got %q", opts.command, positional[1:])
	}
	if opts.key == "" {
		return opts, fmt.Errorf("%s: KEY is empty", opts.command)
	}
	if opts.showResponse && opts.command != "status" {
		return opts, fmt.Errorf("%s: --show-response is a flag of status", opts.command)
	}
	if opts.timeout <= 0 {
		return opts, fmt.Errorf("--timeout %v: must be positive", opts.timeout)
	}
	u, err := url.Parse(opts.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return opts, fmt.Errorf("--url %q: want an http:// or https:// URL (IDEMSVC_URL)", opts.url)
	}
	return opts, nil
}

// checkList checks the arguments of list.
func checkList(opts options, args []string) error {
	switch {
	case len(args) > 0:
		return fmt.Errorf("list: takes no KEY, got %q", args)
	case opts.state != "in_progress" && opts.state != "completed" && opts.state != "failed":
		return fmt.Errorf("list: --state %q: want in_progress, completed or failed", opts.state)
	case opts.olderThan < 0:
		return fmt.Errorf("list: --older-than %v: must not be negative", opts.olderThan)
	case opts.limit < 0:
		return fmt.Errorf("list: --limit %d: must not be negative", opts.limit)
	case opts.showResponse:
		return errors.New("list: --show-response is a flag of status")
	case opts.timeout <= 0:
		return fmt.Errorf("--timeout %v: must be positive", opts.timeout)
	}
	return nil
}

// checkUsage checks the arguments of usage.
func checkUsage(opts options, args []string) error {
	switch {
	case len(args) > 0:
		return fmt.Errorf("usage: takes no KEY, got %q", args)
	case opts.state != "" || opts.olderThan != 0 || opts.limit != 0:
		return errors.New("usage: --state, --older-than and --limit are flags of list")
	case opts.showResponse:
		return errors.New("usage: --show-response is a flag of status")
	case opts.timeout <= 0:
		return fmt.Errorf("--timeout %v: must be positive", opts.timeout)
	}
	return nil
}

// usageOf prints each tenant's usage, a line (or a JSON object) each.
func usageOf(ctx context.Context, client *idem.Client, opts options, stdout, stderr io.Writer) int {
	tenants, err := client.Usage(ctx)
	if err != nil {
		return fail(ctx, client, stderr, opts, err)
	}
	for _, u := range tenants {
		if opts.json {
			if err := writeJSON(stdout, u); err != nil {
				fmt.Fprintf(stderr, "idemctl: %v\n", err)
				return exitError
			}
			continue
		}
		l, r := u.Limits, u.Rejections
		line := fmt.Sprintf("%s  begins/s %.2f%s  stored_bytes %d%s  waiters %d%s  in_progress %d%s  rejections begins_per_s %d, stored_bytes %d, waiters %d, in_progress %d, read_bytes_per_s %d",
			u.Tenant, u.BeginsPerS, ofLimit(l.BeginsPerS), u.StoredBytes, ofLimit(l.StoredBytes), u.Waiters, ofLimit(l.Waiters),
			u.InProgress, ofLimit(l.InProgress), r.BeginsPerS, r.StoredBytes, r.Waiters, r.InProgress, r.ReadBytesPerS)
		if u.StoreUnavailable != nil && *u.StoreUnavailable {
			line += "  (store figures unavailable)"
		}
		fmt.Fprintln(stdout, line)
	}
	return exitOK
}

// ofLimit is " / N" for a limit N, "" for none.
func ofLimit(limit *int64) string {
	if limit == nil {
		return ""
	}
	return " / " + strconv.FormatInt(*limit, 10)
}

// list prints the records in opts.state, a line (or a JSON object) each.
func list(ctx context.Context, client *idem.Client, opts options, stdout, stderr io.Writer) int {
	params := idem.ListParams{State: idem.State(opts.state), OlderThan: opts.olderThan}
	if opts.limit > 0 {
		params.PageSize = min(opts.limit, 1000)
	}
	n := 0
	for rec, err := range client.Keys(ctx, params) {
		if err != nil {
			return fail(ctx, client, stderr, opts, err)
		}
		if opts.json {
			if err := writeJSON(stdout, rec); err != nil {
				fmt.Fprintf(stderr, "idemctl: %v\n", err)
				return exitError
			}
		} else {
			line := fmt.Sprintf("%s  attempt %d  updated %s", printable(rec.Key), rec.Attempt, stamp(rec.UpdatedAt))
			if rec.LeaseExpiresAt != nil {
				line += "  lease until " + stamp(*rec.LeaseExpiresAt)
				if rec.LeaseExpired != nil && *rec.LeaseExpired {
					line += " (expired)"
				}
			}
			if rec.Owner != nil {
				line += "  owner " + printable(*rec.Owner)
			}
			fmt.Fprintln(stdout, line)
		}
		if n++; n == opts.limit {
			break
		}
	}
	return exitOK
}

// status prints the record of opts.key.
func status(ctx context.Context, client *idem.Client, opts options, stdout, stderr io.Writer) int {
	rec, err := client.Status(ctx, opts.key, opts.showResponse)
	if err != nil {
		return fail(ctx, client, stderr, opts, err)
	}
	if opts.json {
		if err := writeJSON(stdout, rec); err != nil {
			fmt.Fprintf(stderr, "idemctl: %v\n", err)
			return exitError
		}
		return exitOK
	}
	var f fields
	f.add("key", rec.Key)
	f.add("tenant", rec.Tenant)
	f.add("state", string(rec.State))
	f.add("attempt", strconv.FormatInt(rec.Attempt, 10))
	if rec.Owner != nil {
		f.add("owner", *rec.Owner)
	}
	if rec.Fingerprint != nil {
		f.add("fingerprint", *rec.Fingerprint)
	}
	f.add("created_at", stamp(rec.CreatedAt))
	f.add("updated_at", stamp(rec.UpdatedAt))
	if rec.LeaseExpiresAt != nil {
		f.add("lease_expires_at", stamp(*rec.LeaseExpiresAt))
	}
	if rec.LeaseExpired != nil {
		f.add("lease_expired", strconv.FormatBool(*rec.LeaseExpired))
	}
	f.add("expires_at", stamp(rec.ExpiresAt))
	if rec.Retryable != nil {
		f.add("retryable", strconv.FormatBool(*rec.Retryable))
	}
	if rec.Error != nil {
		f.add("error", *rec.Error)
	}
	if opts.showResponse {
		if err := addResponse(&f, rec.Response); err != nil {
			fmt.Fprintf(stderr, "idemctl: %s: %v\n", opts.key, err)
			return exitError
		}
	}
	f.write(stdout)
	return exitOK
}

// addResponse adds the fields of a stored response.
func addResponse(f *fields, stored *idem.StoredResponse) error {
	if stored == nil || (stored.StatusCode == nil && len(stored.Headers) == 0 && stored.Body == nil) {
		f.add("response", "(none stored)")
		return nil
	}
	resp, err := stored.Decode()
	if err != nil {
		return err
	}
	if resp.StatusCode != 0 {
		f.add("response.status_code", strconv.Itoa(resp.StatusCode))
	}
	names := make([]string, 0, len(resp.Headers))
	for name := range resp.Headers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		f.add("response.header", printable(name)+": "+printable(resp.Headers[name]))
	}
	text := strings.ReplaceAll(string(resp.Body), "\r\n", "\n")
	switch {
	case stored.Body == nil:
	case len(resp.Body) == 0:
		f.add("response.body", "(empty)")
	case isText([]byte(text)):
		f.addRaw("response.body", text)
	default:
		f.add("response.body", fmt.Sprintf("(binary, %d bytes, shown as base64) %s",
			len(resp.Body), base64.StdEncoding.EncodeToString(resp.Body)))
	}
	return nil
}

// deleteKey forgets the record of opts.key.
func deleteKey(ctx context.Context, client *idem.Client, opts options, stdout, stderr io.Writer) int {
	// idemsvc answers a delete of an absent record as done: read first, so
	// that a key that never existed (a typo, say) is not reported deleted.
	_, err := client.Status(ctx, opts.key, false)
	existed := err == nil
	if err != nil && !errors.Is(err, idem.ErrNotFound) {
		return fail(ctx, client, stderr, opts, err)
	}
	if existed {
		if err := client.Delete(ctx, opts.key); err != nil {
			return fail(ctx, client, stderr, opts, err)
		}
	}
	if !existed && unknownTenant(ctx, client, opts) {
		fmt.Fprintf(stderr, "idemctl: %s %s: tenant %q: not in idemsvc's tenants file\n", opts.command, opts.key, opts.tenant)
		return exitError
	}
	code := exitOK
	if !existed {
		code = exitNotFound
	}
	if opts.json {
		out := struct {
			Deleted bool   `json:"deleted"`
			Key     string `json:"key"`
			Tenant  string `json:"tenant,omitempty"`
		}{existed, opts.key, opts.tenant}
		if err := writeJSON(stdout, out); err != nil {
			fmt.Fprintf(stderr, "idemctl: %v\n", err)
			return exitError
		}
		return code
	}
	var f fields
	f.add("key", opts.key)
	if opts.tenant != "" {
		f.add("tenant", opts.tenant)
	}
	if existed {
		f.add("deleted", "true")
	} else {
		f.add("deleted", "false (no record)")
	}
	f.write(stdout)
	return code
}

// unknownTenant reports whether idemsvc does not know opts.tenant. Its
// answer to a call naming a tenant the tenants file does not list is a
// 404 not-found, as for a key without a record: a listing, which never
// answers 404 otherwise, tells the two apart.
func unknownTenant(ctx context.Context, client *idem.Client, opts options) bool {
	if opts.tenant == "" {
		return false
	}
	for _, err := range client.Keys(ctx, idem.ListParams{State: idem.StateCompleted, PageSize: 1}) {
		return errors.Is(err, idem.ErrNotFound)
	}
	return false
}

// fail reports err on stderr and returns its exit status: 3 when the key
// has no record, 1 for every other error, an unknown tenant included.
func fail(ctx context.Context, client *idem.Client, stderr io.Writer, opts options, err error) int {
	code := exitError
	if errors.Is(err, idem.ErrNotFound) {
		if opts.command != "list" && !unknownTenant(ctx, client, opts) {
			code = exitNotFound
		} else if opts.tenant != "" {
			fmt.Fprintf(stderr, "idemctl: %s %s: tenant %q: not in idemsvc's tenants file\n", opts.command, opts.key, opts.tenant)
			return code
		}
	}
	var e *idem.Error
	if !errors.As(err, &e) {
		fmt.Fprintf(stderr, "idemctl: %s %s: %v\n", opts.command, opts.key, err)
		return code
	}
	msg := fmt.Sprintf("idemctl: %s %s: %d %s", opts.command, opts.key, e.StatusCode, e.Problem.Title)
	if e.Problem.Detail != "" {
		msg += ": " + e.Problem.Detail
	}
	switch {
	case errors.Is(err, idem.ErrUnauthorized):
		msg += " (check --api-key or IDEMSVC_API_KEY)"
	case errors.Is(err, idem.ErrForbidden) && opts.tenant != "":
		msg += fmt.Sprintf(" (only an admin API key may act for tenant %q)", opts.tenant)
	}
	fmt.Fprintln(stderr, msg)
	return code
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func stamp(t idem.MilliTime) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

// isText reports whether b can be shown on a terminal as it is: UTF-8
// without control characters other than tab and newline.
func isText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			return false
		}
	}
	return true
}

// printable is s as it is when it is text on one line, else quoted.
func printable(s string) string {
	if isText([]byte(s)) && !strings.Contains(s, "\n") {
		return s
	}
	return strconv.Quote(s)
}

// fields are "name: value" lines with the values aligned.
type fields struct{ names, values []string }

// add adds a one-line field; a value that is not printable is quoted.
func (f *fields) add(name, value string) {
	f.names = append(f.names, name)
	f.values = append(f.values, printable(value))
}

// addRaw adds a field whose value may span lines; it must be text.
func (f *fields) addRaw(name, value string) {
	f.names = append(f.names, name)
	f.values = append(f.values, value)
}

func (f *fields) write(w io.Writer) {
	width := 0
	for _, n := range f.names {
		width = max(width, len(n)+1)
	}
	indent := "\n" + strings.Repeat(" ", width+1)
	for i, n := range f.names {
		value := strings.ReplaceAll(strings.TrimSuffix(f.values[i], "\n"), "\n", indent)
		fmt.Fprintf(w, "%-*s %s\n", width, n+":", value)
	}
}
