//go:build tools

// Package tools pins the Kubernetes network proxy (konnectivity, sigs.k8s.io/apiserver-network-proxy)
// for relaylet's real-Kubernetes tests: go.mod holds the version, tests/tools/build-k8s.sh builds
// its proxy server and agent from it into the cache outside the repository.
package tools

import (
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/agent"
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/server"
)
