// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemsvc/idemsvc/internal/buildinfo"
)

// tracing returns the tracer provider that the standard OpenTelemetry
// variables in env ask for, or nil when tracing is off: on only when
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is set,
// and neither OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none says
// otherwise. Spans go over OTLP/HTTP in batches (the exporter reads the
// other OTEL_EXPORTER_OTLP_* variables, such as headers and timeouts,
// itself); the SDK reads OTEL_TRACES_SAMPLER. shutdown flushes what is
// buffered.
func tracing(env []string) (provider *sdktrace.TracerProvider, shutdown func(context.Context) error, err error) {
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "OTEL_") {
			vars[k] = v
		}
	}
	endpoint := vars["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
	if endpoint == "" && vars["OTEL_EXPORTER_OTLP_ENDPOINT"] != "" {
		endpoint = strings.TrimSuffix(vars["OTEL_EXPORTER_OTLP_ENDPOINT"], "/") + "/v1/traces"
	}
	if endpoint == "" || strings.EqualFold(vars["OTEL_SDK_DISABLED"], "true") || vars["OTEL_TRACES_EXPORTER"] == "none" {
		return nil, func(context.Context) error { return nil }, nil
	}
	exporter, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(endpoint))
	if err != nil {
		return nil, nil, fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT: %w", err)
	}
	name := vars["OTEL_SERVICE_NAME"]
	if name == "" {
		name = "idemsvc"
	}
	provider = sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter),
		sdktrace.WithResource(resource.NewSchemaless(
			attribute.String("service.name", name), attribute.String("service.version", serviceVersion()))),
	)
	return provider, provider.Shutdown, nil
}

// serviceVersion is the version the traces name.
func serviceVersion() string {
	ver, _, _ := buildinfo.Get()
	return ver
}
