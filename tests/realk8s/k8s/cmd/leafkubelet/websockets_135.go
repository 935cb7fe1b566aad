//go:build !k8s137

// Declaring ExtendWebSocketsToKubelet needs the 1.36+ kubelet streaming code (websockets_137.go).

package main

import (
	"fmt"
	"net/http"
)

func websocketKubelet(http.Handler) (http.Handler, []string, error) {
	return nil, nil, fmt.Errorf("--declare-websockets needs a 1.36+ build (tag k8s137)")
}
