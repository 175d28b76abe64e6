// The pod sandbox's process: holds a pod's namespaces open while its containers come and go.
module sluice.dev/e2e/gomod/pause

go 1.25.0
