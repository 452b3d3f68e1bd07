// SPDX-License-Identifier: Apache-2.0

// Package deploy holds no code: its tests check the deployment files beside
// them (docker-compose.yaml, prometheus.yml, the tenants file, the Grafana
// dashboard and the Helm charts' settings) against the code they configure,
// so that a renamed setting or metric fails `go test` instead of a
// deployment. scripts/lint-deploy.sh runs the tools that need downloads
// (Compose's schema, helm lint, kubeconform).
package deploy
