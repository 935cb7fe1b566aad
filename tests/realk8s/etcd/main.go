// Command etcd starts the etcd server of the pinned go.etcd.io/etcd/server/v3, for relaylet's
// real-Kubernetes tests (tests/realk8s). It is the server's own entry point, nothing more.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
