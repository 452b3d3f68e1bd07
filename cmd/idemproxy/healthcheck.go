// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"

	"github.com/idemsvc/idemsvc/internal/cli"
)

// healthcheck asks the idemproxy that the same configuration describes, on
// this host, whether it serves (GET /healthz), for a container's
// HEALTHCHECK: distroless images have no shell or curl. It returns the
// process's exit status: 0 when it answered 200.
func healthcheck(args, env []string, out io.Writer) int {
	cfg, err := parseConfig(args, env)
	if err != nil {
		fmt.Fprintf(out, "idemproxy healthcheck: %v\n", err)
		return 1
	}
	addr := cfg.listen
	if cfg.adminListen != "" {
		addr = cfg.adminListen
	}
	if err := cli.CheckHealth(addr, nil); err != nil {
		fmt.Fprintf(out, "idemproxy healthcheck: %v\n", err)
		return 1
	}
	return 0
}
