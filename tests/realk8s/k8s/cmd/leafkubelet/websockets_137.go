//go:build k8s137

// What a 1.36+ kubelet does with ExtendWebSocketsToKubelet (pkg/kubelet/server/server.go): it
// declares the feature in its Node's status.declaredFeatures, so the apiserver proxies
// WebSocket calls to it unchanged instead of translating them, and it translates them itself
// towards the container runtime's streaming server: a v5.channel.k8s.io exec or attach to SPDY
// (translator.NewStreamTranslatorHandler) and the port-forward tunnel (SPDY/3.1+portforward.k8s.io
// in WebSocket frames) to plain SPDY (translator.NewTunnelingHandler). leafkubelet's "runtime
// streaming server" is its own routes on a loopback listener under a random path prefix that
// only this process knows.

package main

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/httpstream/wsstream"
	"k8s.io/apimachinery/pkg/util/proxy"
	translator "k8s.io/apiserver/pkg/util/proxy"
)

// declaredWebSockets is the feature a 1.36+ kubelet declares when it serves WebSocket calls.
const declaredWebSockets = "ExtendWebSocketsToKubelet"

// websocketKubelet wraps routes as a declaring kubelet's server does, and says what to declare.
func websocketKubelet(routes http.Handler) (http.Handler, []string, error) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	secret := make([]byte, 16)
	if _, err := rand.Read(secret); err != nil {
		return nil, nil, err
	}
	prefix := "/" + hex.EncodeToString(secret)
	runtime := &http.Server{Handler: http.StripPrefix(prefix, routes), ReadHeaderTimeout: 30 * time.Second}
	go func() { _ = runtime.Serve(listener) }()
	base := "http://" + listener.Addr().String() + prefix
	runtimeURL := func(req *http.Request) (*url.URL, error) {
		u, err := url.Parse(base + req.URL.Path)
		if err != nil {
			return nil, err
		}
		u.RawQuery = req.URL.RawQuery
		return u, nil
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		streams := strings.HasPrefix(req.URL.Path, "/exec/") || strings.HasPrefix(req.URL.Path, "/attach/")
		switch {
		case streams && wsstream.IsWebSocketRequestWithStreamCloseProtocol(req):
			opts, err := newStreamOptions(req)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			location, err := runtimeURL(req)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			translator.NewStreamTranslatorHandler(location, nil, 0, translator.Options{
				Stdin: opts.Stdin, Stdout: opts.Stdout, Stderr: opts.Stderr, Tty: opts.TTY,
			}).ServeHTTP(w, req)
		case strings.HasPrefix(req.URL.Path, "/portForward/") && wsstream.IsWebSocketRequestWithTunnelingProtocol(req):
			location, err := runtimeURL(req)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			upgrade := proxy.NewUpgradeAwareHandler(location, nil, false, true, errorResponder{})
			translator.NewTunnelingHandler(upgrade).ServeHTTP(w, req)
		default:
			routes.ServeHTTP(w, req)
		}
	})
	return handler, []string{declaredWebSockets}, nil
}

// errorResponder answers a failed upgrade to the runtime with a 500, as the kubelet's does.
type errorResponder struct{}

func (errorResponder) Error(w http.ResponseWriter, _ *http.Request, err error) {
	http.Error(w, err.Error(), http.StatusInternalServerError)
}
