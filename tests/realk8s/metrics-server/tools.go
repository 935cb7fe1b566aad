//go:build tools

// Package tools pins metrics-server for relaylet's real-Kubernetes tests: go.mod holds the
// version, tests/tools/build-k8s.sh builds sigs.k8s.io/metrics-server/cmd/metrics-server from it
// into the cache outside the repository.
package tools

import _ "sigs.k8s.io/metrics-server/cmd/metrics-server"
