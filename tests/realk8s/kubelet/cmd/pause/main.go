// pause is the sandbox ("pause") container of the real test node (tests/real_node*.rs): it holds
// a pod's namespaces, reaps orphans as PID 1 must, and exits on SIGTERM or SIGINT. Built static
// by tests/tools/build-node.sh into a one-file image, as no registry is reachable here.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
