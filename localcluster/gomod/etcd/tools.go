//go:build tools

// Package tools keeps the etcd server command in go.mod, so `go mod tidy` does not prune it.
package tools

import _ "go.etcd.io/etcd/server/v3"
