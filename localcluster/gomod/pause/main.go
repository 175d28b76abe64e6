// Command pause is the first process of every pod on the local cluster's real node. It holds the pod's
// namespaces, reaps the zombies of processes that die under it (it is PID 1 of a shared PID namespace), and
// exits on SIGINT or SIGTERM. No registry is reachable here to pull the upstream pause image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
