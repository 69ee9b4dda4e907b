# syntax=docker/dockerfile:1.7
#
# One image, three static binaries (musl: they run in any operand image, Debian or Alpine,
# old or new glibc):
#   /usr/local/bin/dbop           the operator (the entrypoint: `dbop run`, `dbop crd`)
#   /usr/local/bin/dbop-instance  the instance manager: database pods copy it with an init
#                                 container (`cp /usr/local/bin/dbop-instance /dbop/…`, uid 999)
#                                 and run it as the database container's entrypoint
#   /usr/local/bin/dbop-backup    the backup agent, copied into backup Jobs the same way
# The paths are a contract (src/resources/pod.rs). See docs/operand-images.md.
#
# Build: docker build -t dbop:0.1.0 .
# Without Docker: `make static && e2e/testbed/images.sh release` builds the same image as an OCI
# tarball; e2e/testbed/check-image.sh (run by it, and by e2e/tests/helm.rs) fails when the two
# disagree (files, owners, modes, static binaries, USER, ENTRYPOINT, CMD): keep them in step.
# The operator must be told its own image (DBOP_AGENT_IMAGE); the Helm chart sets it to the
# image it deploys.

ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

# ---------------------------------------------------------------------------------------------
# Build stage: the same static build as `make static` (x86_64-unknown-linux-musl; musl-gcc
# compiles the C parts: ring, zstd).
FROM ${RUST_IMAGE} AS build

# busybox-static: a statically linked `cp` for the runtime image, which has no coreutils (the
# init containers that copy dbop's binaries into pods run `cp`).
RUN apt-get update \
 && apt-get install -y --no-install-recommends busybox-static file make musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl

WORKDIR /src
# The whole workspace (every member manifest is needed for --locked, even e2e's);
# .dockerignore keeps target/, .testbed/ and .git/ out of the context.
COPY . .

# The registry and git caches and the target directory are cache mounts: they speed up rebuilds
# but are not part of any layer, so the binaries are copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    make static CARGO=cargo \
 && mkdir -p /out \
 && cp target/x86_64-unknown-linux-musl/release/dbop \
       target/x86_64-unknown-linux-musl/release/dbop-backup \
       target/x86_64-unknown-linux-musl/release/dbop-instance /out/ \
 && cp /bin/busybox /out/cp

# ---------------------------------------------------------------------------------------------
# Runtime stage: distroless static (CA certificates, no libc, no shell, no package manager).
FROM ${RUNTIME_IMAGE}

ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="dbop" \
      org.opencontainers.image.description="A Kubernetes operator that runs PostgreSQL with its whole lifecycle, its instance manager and its backup agent" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="gcr.io/distroless/static-debian12:nonroot"

# Owned by root, world-readable and executable: the operator runs as 65532, the init
# containers that copy the binaries as 999, and neither may modify them.
COPY --from=build --chown=0:0 --chmod=0755 /out/dbop /usr/local/bin/dbop
COPY --from=build --chown=0:0 --chmod=0755 /out/dbop-instance /usr/local/bin/dbop-instance
COPY --from=build --chown=0:0 --chmod=0755 /out/dbop-backup /usr/local/bin/dbop-backup
# busybox runs the applet named by argv[0]: installed as `cp`, it is `cp`.
COPY --from=build --chown=0:0 --chmod=0755 /out/cp /usr/bin/cp

# distroless's `nonroot` user; numeric so that runAsNonRoot can verify it.
USER 65532:65532

ENTRYPOINT ["/usr/local/bin/dbop"]
CMD ["run"]
