# syntax=docker/dockerfile:1.7
#
# One image, two binaries:
#   /usr/local/bin/dbop         the operator (the entrypoint: `dbop run`, `dbop crd`)
#   /usr/local/bin/dbop-backup  the backup agent. Backup Jobs copy it out of this image with an
#                               init container (`cp /usr/local/bin/dbop-backup /agent/…`, run as
#                               uid 999) and run it inside the official PostgreSQL image of the
#                               Database's version. The path is a contract (src/backup/job.rs).
#
# Build: docker build -t dbop:0.1.0 .
# The operator must be told its own image for backup Jobs (DBOP_AGENT_IMAGE); the Helm chart
# sets it to the image it deploys.

ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

# ---------------------------------------------------------------------------------------------
# Build stage: Debian bookworm (glibc 2.36).
# Both binaries link glibc dynamically. The agent runs inside the Debian-based official postgres
# images (bookworm: glibc 2.36, trixie: 2.41), so it must be built against a glibc no newer than
# theirs: keep this stage on bookworm. The Alpine (musl) postgres images cannot run the agent.
FROM ${RUST_IMAGE} AS build

# busybox-static: a statically linked `cp` for the runtime image, which has no coreutils (the
# backup Job's init container runs `cp`).
RUN apt-get update \
 && apt-get install -y --no-install-recommends busybox-static \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# The whole workspace (every member manifest is needed for --locked, even e2e's);
# .dockerignore keeps target/, .testbed/ and .git/ out of the context.
COPY . .

# The registry and git caches and the target directory are cache mounts: they speed up rebuilds
# but are not part of any layer, so the binaries are copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin dbop --bin dbop-backup \
 && mkdir -p /out \
 && cp target/release/dbop target/release/dbop-backup /out/ \
 && cp /bin/busybox /out/cp

# ---------------------------------------------------------------------------------------------
# Runtime stage: distroless with glibc, libgcc and CA certificates; no shell, no package manager.
FROM ${RUNTIME_IMAGE}

ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="dbop" \
      org.opencontainers.image.description="A Kubernetes operator that runs PostgreSQL with its whole lifecycle, and its backup agent" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="gcr.io/distroless/cc-debian12:nonroot"

# Owned by root, world-readable and executable: the operator runs as 65532, the backup Job's
# init container as 999, and neither may modify the binaries.
COPY --from=build --chown=0:0 --chmod=0755 /out/dbop /usr/local/bin/dbop
COPY --from=build --chown=0:0 --chmod=0755 /out/dbop-backup /usr/local/bin/dbop-backup
# busybox runs the applet named by argv[0]: installed as `cp`, it is `cp`.
COPY --from=build --chown=0:0 --chmod=0755 /out/cp /usr/bin/cp

# distroless's `nonroot` user; numeric so that runAsNonRoot can verify it.
USER 65532:65532

ENTRYPOINT ["/usr/local/bin/dbop"]
CMD ["run"]
