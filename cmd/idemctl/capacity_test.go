// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestCapacityMatchesTheDocs: idemctl capacity prints, for the worked
// example's numbers, the table docs/capacity.md shows under the command.
func TestCapacityMatchesTheDocs(t *testing.T) {
	const command = "idemctl capacity --rate 10000 --retention 24h --answer-bytes 2048"
	doc, err := os.ReadFile("../../docs/capacity.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "$ "+command+"\n")
	want, _, closed := strings.Cut(after, "```")
	if !ok || !closed {
		t.Fatalf("docs/capacity.md has no block that starts with %q", "$ "+command)
	}
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), strings.Fields(command)[1:], nil, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if got := stdout.String(); got != want {
		t.Errorf("idemctl capacity printed\n%s\ndocs/capacity.md shows\n%s", got, want)
	}
}

// TestCapacityFlags: a missing or wrong flag is an error naming it.
func TestCapacityFlags(t *testing.T) {
	for args, want := range map[string]string{
		"--retention 24h --answer-bytes 2048":                            "--rate",
		"--rate 10 --answer-bytes 2048":                                  "--retention",
		"--rate 10 --retention 24h":                                      "--answer-bytes",
		"--rate 10 --retention 24h --answer-bytes 1 --compressibility x": "--compressibility",
		"--rate 10 --retention 24h --answer-bytes 1 --maxmemory-ratio 2": "--maxmemory-ratio",
		"--rate 10 --retention 24h --answer-bytes 1 extra":               "extra",
	} {
		var stdout, stderr bytes.Buffer
		if code := run(t.Context(), append([]string{"capacity"}, strings.Fields(args)...), nil, &stdout, &stderr); code != exitError || !strings.Contains(stderr.String(), want) {
			t.Errorf("%s: exit %d, %q; want an error naming %s", args, code, stderr.String(), want)
		}
	}
}
