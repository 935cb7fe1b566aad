//go:build k8s137

// The kubelet streaming code of Kubernetes 1.36+: k8s.io/cri-streaming, with the pod UID as a
// string and its own TerminalSize (see streaming_135.go for the older one).

package main

import (
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	remotecommandserver "k8s.io/cri-streaming/pkg/streaming/remotecommand"
)

// podUID is how the streaming code names a pod's UID.
type podUID = string

// terminalSize is what the streaming code sends on a resize.
type terminalSize = remotecommandserver.TerminalSize

var (
	newStreamOptions       = remotecommandserver.NewOptions
	serveExec              = remotecommandserver.ServeExec
	serveAttach            = remotecommandserver.ServeAttach
	newPortForwardOptions  = portforward.NewV4Options
	servePortForward       = portforward.ServePortForward
	remoteCommandProtocols = remotecommandserver.SupportedStreamingProtocols
	portForwardProtocols   = portforward.SupportedProtocols
)
