module dbop.dev/testbed/pause

go 1.26.0
