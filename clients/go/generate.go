package idem

//go:generate go tool oapi-codegen -config client.cfg.yaml ../../api/openapi.yaml
