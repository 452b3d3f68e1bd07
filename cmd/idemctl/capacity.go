// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/idemsvc/idemsvc/internal/capacity"
)

const capacityUsage = `usage:
  idemctl capacity --rate R --retention D --answer-bytes N [--compressibility C]
      [--master-bytes B] [--maxmemory-ratio F] [--reserve-bytes B]
      [--redis-cpu-share F] [--instance-cores N] [--cpu-share F]

prints the capacity model of docs/capacity.md: bytes per record, Redis
memory, masters and idemsvc instances, with answers kept as sent (before
compression), compressed, and by reference. It needs no idemsvc.

  --rate R             begins per second, each completed with an answer
  --retention D        how long records are kept (e.g. 24h)
  --answer-bytes N     body bytes of a typical answer
  --compressibility C  compressed size over size (zstd -1), or json for JSON
                       answers as measured (default json)
  --master-bytes B     memory of a Redis master (default 68719476736, 64 GiB)
  --maxmemory-ratio F  maxmemory over that memory (default 0.75)
  --reserve-bytes B    IDEMSVC_REDIS_RESERVE_BYTES (default 67108864)
  --redis-cpu-share F  share of a master's core to use at most (default 0.5)
  --instance-cores N   cores of an idemsvc instance (default 2)
  --cpu-share F        share of an instance's cores to use at most (default 0.6)
`

// capacityCmd runs idemctl capacity with args (after the command's name).
func capacityCmd(args []string, stdout, stderr io.Writer) int {
	in, err := parseCapacity(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, capacityUsage)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "idemctl capacity: %v\n\n%s", err, capacityUsage)
		return exitError
	}
	if err := capacity.Model(in).Print(stdout); err != nil {
		fmt.Fprintf(stderr, "idemctl capacity: %v\n", err)
		return exitError
	}
	return exitOK
}

// parseCapacity reads capacity's flags into a checked Input.
func parseCapacity(args []string) (capacity.Input, error) {
	in := capacity.Defaults()
	fs := flag.NewFlagSet("idemctl capacity", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Float64Var(&in.Rate, "rate", 0, "")
	fs.DurationVar(&in.Retention, "retention", 0, "")
	fs.IntVar(&in.AnswerBytes, "answer-bytes", -1, "")
	compressibility := fs.String("compressibility", "json", "")
	fs.Int64Var(&in.MasterBytes, "master-bytes", in.MasterBytes, "")
	fs.Float64Var(&in.MaxmemoryRatio, "maxmemory-ratio", in.MaxmemoryRatio, "")
	fs.Int64Var(&in.ReserveBytes, "reserve-bytes", in.ReserveBytes, "")
	fs.Float64Var(&in.RedisCPUShare, "redis-cpu-share", in.RedisCPUShare, "")
	fs.Float64Var(&in.InstanceCores, "instance-cores", in.InstanceCores, "")
	fs.Float64Var(&in.CPUShare, "cpu-share", in.CPUShare, "")
	if err := fs.Parse(args); err != nil {
		return in, err
	}
	if fs.NArg() > 0 {
		return in, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if in.AnswerBytes < 0 {
		return in, errors.New("--answer-bytes: required")
	}
	if *compressibility != "json" {
		c, err := strconv.ParseFloat(*compressibility, 64)
		if err != nil || c <= 0 {
			return in, fmt.Errorf("--compressibility %q: want json or a ratio over 0 (compressed size over size)", *compressibility)
		}
		in.Compressibility = c
	}
	return in, in.Check()
}
