// Command etcd is the etcd server, built from go.etcd.io/etcd/server/v3 at the version pinned in
// e2e/testbed/versions.env (upstream's etcd main package lives in a module with local replace
// directives, so it cannot be built from the module proxy directly).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
