// Package api holds the HTTP API of idemsvc, generated from api/openapi.yaml.
package api

//go:generate go tool oapi-codegen -config server.cfg.yaml ../../api/openapi.yaml
