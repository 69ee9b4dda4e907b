# dbop — the two commands of the quick start are `make run` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo
# The registry path a release publishes to (DBOP_IMAGE_REPOSITORY, DBOP_CHART_REPOSITORY): set
# once, in release.env. `make release IMAGE_REPOSITORY=… CHART_REPOSITORY=…` publishes elsewhere.
include release.env
IMAGE_REPOSITORY ?= $(DBOP_IMAGE_REPOSITORY)
CHART_REPOSITORY ?= $(DBOP_CHART_REPOSITORY)
PUSH ?= 0
TESTBED_DIR ?= $(or $(DBOP_TESTBED_DIR),$(CURDIR)/.testbed)
export DBOP_TESTBED_DIR := $(TESTBED_DIR)

# The static binaries are built for both targets in one cargo invocation (build scripts and proc
# macros compile once, for the host). The C parts (ring, zstd) compile with Debian's musl wrappers
# <arch>-linux-musl-gcc (musl-dev:amd64 and musl-dev:arm64: the arch's gcc with musl's headers),
# and the arch's gcc links against Rust's own musl (self-contained). The same names work on an
# x86_64 and an aarch64 build host (the native gcc for one, Debian's cross gcc for the other).
MUSL_TARGET := x86_64-unknown-linux-musl
ARM_MUSL_TARGET := aarch64-unknown-linux-musl
STATIC_TARGETS := $(MUSL_TARGET) $(ARM_MUSL_TARGET)
STATIC_TOOLS := x86_64-linux-musl-gcc x86_64-linux-gnu-gcc x86_64-linux-gnu-ar aarch64-linux-musl-gcc aarch64-linux-gnu-gcc aarch64-linux-gnu-ar
export CC_x86_64_unknown_linux_musl := x86_64-linux-musl-gcc
export AR_x86_64_unknown_linux_musl := x86_64-linux-gnu-ar
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_LINKER := x86_64-linux-gnu-gcc
export CC_aarch64_unknown_linux_musl := aarch64-linux-musl-gcc
export AR_aarch64_unknown_linux_musl := aarch64-linux-gnu-ar
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER := aarch64-linux-gnu-gcc

# Each step of `make test` (and of .ci/run) appends its time here (e2e/timed.sh); the table at the
# end of `make test` is printed from it (e2e/times.sh).
export DBOP_TIMES ?= $(CURDIR)/target/test-times.tsv
TIMED := $(CURDIR)/e2e/timed.sh
# A warm `make test` (test bed and cargo caches warm, nothing to compile) should stay within this;
# the table at its end says when it does not.
TEST_BUDGET_SECONDS ?= 900
STATIC_BINS := dbop dbop-backup dbop-instance

.PHONY: deps release plugin help build build-tests static test test-unit test-e2e lint fmt crds testbed-build testbed-up testbed-down images run bench bench-ha bench-backup bench-scrape bench-autogrow fuzz

run: ## the operator on a control plane (the local one when none is configured) and the example Database reaching Ready; on a configured cluster it asks first (YES=1: without asking)
	@scripts/install-deps.sh --if-missing system rust testbed
	DBOP_RUN_YES=$(if $(filter 1 yes,$(YES)),1,$${DBOP_RUN_YES:-}) e2e/run.sh

help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | column -t -s $$'\t'

deps: ## install everything `make run` and `make test` need (as root, Debian 12: packages, rustup targets, test bed and backup test tools; not Rust or Go themselves)
	scripts/install-deps.sh

release: ## the release's multi-arch image (OCI archive, no Docker) and chart into target/release-artifacts (root); PUSH=1 publishes them to release.env's registry path (docs/install.md)
	$(MAKE) --no-print-directory static
	IMAGE_REPOSITORY=$(IMAGE_REPOSITORY) CHART_REPOSITORY=$(CHART_REPOSITORY) PUSH=$(PUSH) scripts/release.sh

build: ## build the binaries (release)
	$(CARGO) build --release --bins

static: ## build dbop, dbop-backup and dbop-instance static (musl, release) for x86_64 and aarch64 into target/<x86_64|aarch64>-unknown-linux-musl/release
	@missing=; for t in $(STATIC_TARGETS); do rustup target list --installed 2>/dev/null | grep -qx $$t || missing="$$missing rustup-target:$$t"; done; \
	  for c in $(STATIC_TOOLS); do command -v $$c >/dev/null || missing="$$missing $$c"; done; \
	  [ -z "$$missing" ] || { echo "make static is missing:$$missing"; \
	    echo "  rustup target add $(STATIC_TARGETS)"; \
	    echo "  dpkg --add-architecture arm64 && apt-get update && apt-get install musl-dev musl-dev:arm64 (on an aarch64 host: amd64, musl-dev:amd64; e2e/testbed/install-deps.sh does this)"; exit 1; }
	$(CARGO) build --release --locked $(addprefix --target ,$(STATIC_TARGETS)) -p dbop -p dbop-backup -p dbop-instance --bins
	@for t in $(STATIC_TARGETS); do for b in $(STATIC_BINS); do \
	  f=$${CARGO_TARGET_DIR:-target}/$$t/release/$$b; \
	  file -L $$f | grep -Eq 'statically linked|static-pie linked' || { echo "$$f is not static: $$(file -L $$f)"; exit 1; }; \
	  case $$t in x86_64-*) arch=x86-64 ;; aarch64-*) arch='ARM aarch64' ;; esac; \
	  file -L $$f | grep -q "$$arch" || { echo "$$f is not $$arch: $$(file -L $$f)"; exit 1; }; \
	  echo "$$f: static, $$arch"; \
	done; done

plugin: ## install the kubectl plugin (`kubectl dbop ...`) as kubectl-dbop into cargo's bin directory (~/.cargo/bin), with kubectl_complete-dbop for `kubectl dbop <TAB>`
	$(CARGO) install --locked --path . --bin kubectl-dbop
	bin="$${CARGO_INSTALL_ROOT:-$${CARGO_HOME:-$$HOME/.cargo}}/bin"; ln -sf kubectl-dbop "$$bin/kubectl_complete-dbop" && echo "installed $$bin/kubectl-dbop and $$bin/kubectl_complete-dbop"

fmt: ## format the code
	$(CARGO) fmt --all

lint: ## formatting, clippy (warnings are errors) and no import circles
	$(TIMED) "lint: fmt" $(CARGO) fmt --all --check
	$(TIMED) "lint: clippy" $(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	$(TIMED) "lint: import graph" $(CARGO) test -q --locked --workspace --test import_graph

crds: ## regenerate crds/ (and the chart's copy) from the API types
	$(CARGO) run -q --bin dbop -- crd > crds/dbop.dev.yaml
	cp crds/dbop.dev.yaml charts/dbop/crds/dbop.dev.yaml

test-unit: ## tests that need no cluster (pure logic, request shapes, the backup agent with real PostgreSQL and S3)
	$(TIMED) "unit tests" env CARGO=$(CARGO) scripts/unit-tests.sh
	$(TIMED) "unit: e2e scheduler" $(CARGO) test -q --locked --workspace --bin e2e-suites

testbed-build: ## build the local control plane (and the real node's binaries when the host can run it) from Go modules, cached outside the repo
	e2e/testbed/build.sh

images: ## build the real node's OCI images (PostgreSQL 15.18/15.20 from Debian, s3s-fs, pause, dbop from target/release)
	e2e/testbed/images.sh

testbed-up: testbed-build ## start etcd, kube-apiserver, controller-manager, scheduler, kwok on loopback, and the real node when the host allows
	e2e/testbed/up.sh

testbed-down: ## stop the local control plane and the real node, leaving nothing behind
	e2e/testbed/down.sh

# dbop.local/dbop:dev for the real node (e2e/testbed/dbop-image.sh loads it after up.sh): each binary
# from the first directory that has it, so the static ones `make static` already built (the database
# pod needs a static dbop-instance) — no second musl build of the same code.
E2E_IMAGE_BIN_DIR := $(CURDIR)/target/$(MUSL_TARGET)/release:$(CURDIR)/target/debug
# How many e2e suites run at once, and how many of them on the real node (e2e/suites.yaml).
E2E_JOBS ?= 4
E2E_REAL_NODE_JOBS ?= 2

build-tests: ## compile everything `make test` runs, so that it only runs (CI builds this beside the test bed)
	$(TIMED) "build: debug, all targets" $(CARGO) build --locked --workspace --all-targets
	$(TIMED) "build: clippy" $(CARGO) clippy --locked --workspace --all-targets -- -D warnings
	$(TIMED) "build: static (musl, release, x86_64 + aarch64)" $(MAKE) --no-print-directory static
	@# What `make run` (e2e/run.sh) builds, the same way: the make_run suite runs it, and its features
	@# differ from the all-targets build's, so it would compile dbop again inside a timed test.
	$(TIMED) "build: make run's" sh -c '$(CARGO) build --bins && $(CARGO) build --target $(MUSL_TARGET) -p dbop-instance'

test-e2e: ## end-to-end suites against the local control plane, side by side (brings it up and down; checks that down leaves nothing behind)
	$(TIMED) "e2e: build" $(CARGO) build --locked --workspace --all-targets
	@# The release image (the Dockerfile's, from `make static`) is what the in-cluster Helm install runs.
	$(TIMED) "e2e: static" $(MAKE) --no-print-directory static
	@set -o pipefail; status=0; hoststate=; \
	  if [ -f $(TESTBED_DIR)/ready ]; then echo "test bed already up: no before/after host-state check this time"; \
	  else hoststate=$$(mktemp); e2e/testbed/check-clean.sh snapshot $$hoststate; fi; \
	  $(TIMED) "e2e: test bed up" $(MAKE) --no-print-directory testbed-up || status=$$?; \
	  if [ $$status = 0 ]; then DBOP_IMAGE_BIN_DIR=$(E2E_IMAGE_BIN_DIR) $(TIMED) "e2e: dbop images" e2e/testbed/dbop-image.sh dev release || status=$$?; fi; \
	  if [ $$status = 0 ]; then KUBECONFIG=$(TESTBED_DIR)/kubeconfig $(TIMED) "e2e: suites" $(CURDIR)/target/debug/e2e-suites \
	    --jobs $(E2E_JOBS) --real-node-jobs $(E2E_REAL_NODE_JOBS) || status=$$?; fi; \
	  $(TIMED) "e2e: test bed down" $(MAKE) --no-print-directory testbed-down || status=$$?; \
	  if [ -n "$$hoststate" ]; then e2e/testbed/check-clean.sh verify $$hoststate || status=$$?; rm -f $$hoststate; fi; exit $$status

test: ## every test: lint, unit and agent tests, then end-to-end on the local control plane; ends with where the time went
	@scripts/install-deps.sh --if-missing
	@start=$$(date +%s); mkdir -p $(dir $(DBOP_TIMES)); : > $(DBOP_TIMES); status=0; \
	  $(MAKE) --no-print-directory lint test-unit test-e2e || status=$$?; \
	  e2e/times.sh $(DBOP_TIMES) "make test" $$(( $$(date +%s) - start )) $(TEST_BUDGET_SECONDS); \
	  if [ $$status != 0 ]; then echo "make test FAILED (status $$status)"; fi; exit $$status

fuzz: ## fuzz the manifest, termination-message, duration/size parsers and the dump-archive row counter (nightly + cargo-fuzz; FUZZ_SECONDS per target, default 60; not part of `make test`)
	fuzz/run.sh

bench-backup: ## benchmark dbop-backup dump against pg_dump | zstd | rclone rcat, and base-backup, WAL archiving under pgbench, recover and the RPO against pg_basebackup and PostgreSQL's own replay (LOGICAL=0 / PHYSICAL=0 run one side; figures in docs/benchmarks.md)
	backups/bench/run.sh

bench-ha: ## failover, isolation and switchover write gaps of a 3-instance Database on the real node (BENCH_HA_TRIALS per kind, default 20; not part of `make test`; figures in docs/benchmarks.md)
	e2e/bench/ha.sh

bench-scrape: ## what one scrape of an instance's metrics endpoint costs (BENCH_SCRAPE_RUNS runs of 20 scrapes each, default 3; real PostgreSQL; figures in docs/benchmarks.md)
	@for i in $$(seq $${BENCH_SCRAPE_RUNS:-3}); do \
	  $(CARGO) test -q --locked -p dbop-instance --test metrics each_metric_is_what_postgresql_reports -- --nocapture 2>&1 | grep '^scrape cost' || exit 1; \
	done; echo "load: $$(cut -d' ' -f1-3 /proc/loadavg)"

bench-autogrow: ## how long a volume past its autoGrow threshold waits for dbop to grow it (BENCH_AUTOGROW_RUNS runs, default 3; the real node; figures in docs/benchmarks.md)
	e2e/bench/autogrow.sh

bench: ## dbop at 1,000 Databases on a kwok-only test bed (scale, idle, self-repair, startup; not part of `make test`; figures in docs/benchmarks.md)
	e2e/bench/run.sh
