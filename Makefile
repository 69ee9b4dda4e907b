# dbop — the two commands of the quick start are `make run` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo
TESTBED_DIR ?= $(CURDIR)/.testbed
export DBOP_TESTBED_DIR := $(TESTBED_DIR)

.PHONY: help build test test-unit test-e2e lint fmt crds testbed-build testbed-up testbed-down run bench-backup

run: ## the operator on a control plane (the local one when none is configured) and the example Database reaching Ready
	e2e/run.sh

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | column -t -s $$'\t'

build: ## build both binaries (release)
	$(CARGO) build --release --bins

fmt: ## format the code
	$(CARGO) fmt --all

lint: ## formatting, clippy (warnings are errors) and no import circles
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) test -q -p dbop --test import_graph

crds: ## regenerate crds/ (and the chart's copy) from the API types
	$(CARGO) run -q --bin dbop -- crd > crds/dbop.dev.yaml
	cp crds/dbop.dev.yaml charts/dbop/crds/dbop.dev.yaml

test-unit: ## tests that need no cluster (pure logic, request shapes, the backup agent with real PostgreSQL and S3)
	$(CARGO) test --workspace --exclude dbop-e2e

testbed-build: ## build the local control plane from Go modules (cached outside the repo)
	e2e/testbed/build.sh

testbed-up: testbed-build ## start etcd, kube-apiserver, controller-manager, scheduler and kwok on loopback
	e2e/testbed/up.sh

testbed-down: ## stop the local control plane, leaving no process behind
	e2e/testbed/down.sh

test-e2e: ## end-to-end suites against the local control plane (brings it up and down)
	$(CARGO) build --bins
	@$(MAKE) --no-print-directory testbed-up
	@set -o pipefail; status=0; \
	  KUBECONFIG=$(TESTBED_DIR)/kubeconfig $(CARGO) test -p dbop-e2e -- --test-threads=4 --nocapture || status=$$?; \
	  $(MAKE) --no-print-directory testbed-down; exit $$status

test: lint test-unit test-e2e ## every test: lint, unit and agent tests, then end-to-end on the local control plane

bench-backup: ## benchmark dbop-backup dump against pg_dump | zstd | rclone rcat (writes docs/benchmarks.md figures)
	agent/bench/run.sh
