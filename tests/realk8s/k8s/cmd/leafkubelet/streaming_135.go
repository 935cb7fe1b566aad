//go:build !k8s137

// The kubelet streaming code of Kubernetes 1.35 and before: k8s.io/kubelet/pkg/cri/streaming,
// with the pod UID as a types.UID and client-go's TerminalSize. streaming_137.go is the same
// adapter for 1.36+, where the code moved to k8s.io/cri-streaming; build-k8s.sh picks one by
// the k8s137 build tag, so the rest of leafkubelet is one source for every version.

package main

import (
	"k8s.io/apimachinery/pkg/types"
	remotecommandconsts "k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/kubelet/pkg/cri/streaming/portforward"
	remotecommandserver "k8s.io/kubelet/pkg/cri/streaming/remotecommand"
)

// podUID is how the streaming code names a pod's UID.
type podUID = types.UID

// terminalSize is what the streaming code sends on a resize.
type terminalSize = remotecommand.TerminalSize

var (
	newStreamOptions       = remotecommandserver.NewOptions
	serveExec              = remotecommandserver.ServeExec
	serveAttach            = remotecommandserver.ServeAttach
	newPortForwardOptions  = portforward.NewV4Options
	servePortForward       = portforward.ServePortForward
	remoteCommandProtocols = remotecommandconsts.SupportedStreamingProtocols
	portForwardProtocols   = portforward.SupportedProtocols
)
