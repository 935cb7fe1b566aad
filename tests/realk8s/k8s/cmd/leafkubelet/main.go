// Command leafkubelet is a small kubelet for relaylet's real-Kubernetes tests. It registers one
// Node with a real (leaf) kube-apiserver and keeps its Lease, runs the containers of the pods
// bound to that Node as local processes, reports their status as a kubelet would, and serves
// the kubelet API the apiserver calls: exec, attach and portForward with the kubelet's own
// streaming code (k8s.io/kubelet/pkg/cri/streaming up to 1.35, k8s.io/cri-streaming since 1.36;
// SPDY and WebSocket; streaming_13*.go), and containerLogs from
// CRI-format log files.
//
// It is test equipment: one process per leaf node, all on loopback. Containers share the host's
// network, so each container port P is served on a free local port the container finds in its
// environment as PORT_<P>, and port-forward connects there.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the leaf apiserver")
	nodeName := flag.String("node-name", "", "the Node this kubelet serves")
	listen := flag.String("listen", "127.0.0.1:0", "address of the kubelet API")
	addrFile := flag.String("addr-file", "", "where to write the address listened on")
	certFile := flag.String("tls-cert", "", "serving certificate (PEM)")
	keyFile := flag.String("tls-key", "", "serving key (PEM)")
	clientCA := flag.String("client-ca", "", "CA that signs the apiserver's kubelet client certificate")
	dataDir := flag.String("data-dir", "", "where container logs and work directories go")
	declareWebSockets := flag.Bool("declare-websockets", false,
		"declare ExtendWebSocketsToKubelet and translate WebSocket calls here, as a 1.36+ kubelet does")
	flag.Parse()
	for name, value := range map[string]string{
		"kubeconfig": *kubeconfig, "node-name": *nodeName, "tls-cert": *certFile,
		"tls-key": *keyFile, "client-ca": *clientCA, "data-dir": *dataDir,
	} {
		if value == "" {
			log.Fatalf("leafkubelet: --%s is required", name)
		}
	}

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatalf("leafkubelet: kubeconfig: %v", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		log.Fatalf("leafkubelet: client: %v", err)
	}

	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("leafkubelet: listen: %v", err)
	}
	port := listener.Addr().(*net.TCPAddr).Port

	h := newHost(client, *nodeName, *dataDir)
	handler := h.routes()
	if *declareWebSockets {
		handler, h.declared, err = websocketKubelet(handler)
		if err != nil {
			log.Fatalf("leafkubelet: %v", err)
		}
	}
	ctx := context.Background()
	if err := h.registerNode(ctx, int32(port)); err != nil {
		log.Fatalf("leafkubelet: registering node %s: %v", *nodeName, err)
	}
	go h.heartbeat(ctx)
	go h.runPods(ctx)

	tlsConfig, err := serverTLS(*certFile, *keyFile, *clientCA)
	if err != nil {
		log.Fatalf("leafkubelet: TLS: %v", err)
	}
	server := &http.Server{
		Handler:           handler,
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: 30 * time.Second,
	}
	if *addrFile != "" {
		if err := os.WriteFile(*addrFile, []byte(listener.Addr().String()), 0o600); err != nil {
			log.Fatalf("leafkubelet: %v", err)
		}
	}
	log.Printf("leafkubelet: node %s serving on %s", *nodeName, listener.Addr())
	log.Fatal(server.ServeTLS(listener, "", ""))
}

// serverTLS serves certFile and requires client certificates signed by clientCA, like a kubelet
// with --client-ca-file and no anonymous access.
func serverTLS(certFile, keyFile, clientCA string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	pem, err := os.ReadFile(clientCA)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no certificate in %s", clientCA)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    roots,
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"http/1.1"},
	}, nil
}

// podKey is how pods are found by the streaming handlers: namespace/name.
func podKey(pod *v1.Pod) string {
	return pod.Namespace + "/" + pod.Name
}

// containerEnv is a container's environment: its literal env values and PORT_<P> for each
// container port P.
func containerEnv(c *v1.Container, ports map[int32]int) []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=/tmp"}
	for _, e := range c.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	for containerPort, local := range ports {
		env = append(env, fmt.Sprintf("PORT_%d=%d", containerPort, local))
	}
	return env
}

// argv is what a container runs: command then args.
func argv(c *v1.Container) []string {
	return append(append([]string{}, c.Command...), c.Args...)
}

// freePort picks a free loopback port for a container port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func splitPath(path string) []string {
	return strings.Split(strings.Trim(path, "/"), "/")
}
