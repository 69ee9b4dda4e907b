# syntax=docker/dockerfile:1.7
#
# One image, three static binaries (musl: they run in any operand image, Debian or Alpine,
# old or new glibc), for linux/amd64 and linux/arm64:
#   /usr/local/bin/dbop           the operator (the entrypoint: `dbop run`, `dbop crd`)
#   /usr/local/bin/dbop-instance  the instance manager: database pods copy it with an init
#                                 container (`cp /usr/local/bin/dbop-instance /dbop/…`, uid 999)
#                                 and run it as the database container's entrypoint
#   /usr/local/bin/dbop-backup    the backup agent, copied into backup Jobs the same way
# The paths are a contract (src/resources/pod.rs). See docs/operand-images.md.
#
# One image index for linux/amd64 and linux/arm64 (DBOP_ARCHES below):
#   docker buildx build --platform linux/amd64,linux/arm64 -t ghcr.io/dbop-dev/dbop:0.1.0 --push .  (release.env)
# The build stage runs once, on the build host's platform ($BUILDPLATFORM: cross-compiling, never
# emulating), and `make static` builds both architectures in one cargo run; each platform's final
# stage copies its own binaries (/out/$TARGETARCH). `docker build -t ghcr.io/dbop-dev/dbop:0.1.0 .` builds the
# host's platform only.
# Without Docker: `make static && e2e/testbed/images.sh release` builds the same image as an OCI
# tarball; e2e/testbed/check-image.sh (run by it, and by e2e/tests/helm.rs) fails when the two
# disagree (files, owners, modes, static binaries, USER, ENTRYPOINT, CMD): keep them in step.
# The operator must be told its own image (DBOP_AGENT_IMAGE); the Helm chart sets it to the
# image it deploys.

ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

# ---------------------------------------------------------------------------------------------
# Build stage: the same static build as `make static` (x86_64- and aarch64-unknown-linux-musl;
# Debian's <arch>-linux-musl-gcc compile the C parts: ring, zstd), on the build host's platform.
# It uses no TARGETARCH, so BuildKit runs it once for both platforms.
FROM --platform=$BUILDPLATFORM ${RUST_IMAGE} AS build

# Debian's names, which are Docker's TARGETARCH (check-image.sh compares this list with the index
# images.sh release writes).
ARG DBOP_ARCHES="amd64 arm64"
# musl-dev of each architecture: its musl-gcc wrapper and headers, and (for the foreign one) its
# cross gcc. busybox-static of each: a statically linked `cp` for the runtime image, which has no
# coreutils (the init containers that copy dbop's binaries into pods run `cp`).
RUN native="$(dpkg --print-architecture)" \
 && for a in $DBOP_ARCHES; do [ "$a" = "$native" ] || dpkg --add-architecture "$a"; done \
 && apt-get update \
 && apt-get install -y --no-install-recommends file make $(for a in $DBOP_ARCHES; do echo "musl-dev:$a"; done) \
 && mkdir -p /busybox && cd /busybox \
 && apt-get download $(for a in $DBOP_ARCHES; do echo "busybox-static:$a"; done) \
 && for a in $DBOP_ARCHES; do mkdir -p "$a" && dpkg-deb -x busybox-static_*_"$a".deb "$a"; done \
 && rm -rf /var/lib/apt/lists/* /busybox/*.deb \
 && rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl

WORKDIR /src
# The whole workspace (every member manifest is needed for --locked, even e2e's);
# .dockerignore keeps target/, .testbed/ and .git/ out of the context.
COPY . .

# The registry and git caches and the target directory are cache mounts: they speed up rebuilds
# but are not part of any layer, so the binaries are copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    triple() { case "$1" in amd64) echo x86_64-unknown-linux-musl ;; arm64) echo aarch64-unknown-linux-musl ;; esac; } \
 && make static CARGO=cargo STATIC_TARGETS="$(for a in $DBOP_ARCHES; do printf '%s ' "$(triple "$a")"; done)" \
 && for a in $DBOP_ARCHES; do \
      t="$(triple "$a")" && mkdir -p "/out/$a" \
      && cp "target/$t/release/dbop" "target/$t/release/dbop-backup" "target/$t/release/dbop-instance" "/out/$a/" \
      && cp "/busybox/$a/bin/busybox" "/out/$a/cp" || exit 1; \
    done

# ---------------------------------------------------------------------------------------------
# Runtime stage: distroless static (CA certificates, no libc, no shell, no package manager).
FROM ${RUNTIME_IMAGE}

# Set by BuildKit to the platform being built (amd64, arm64).
ARG TARGETARCH
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
COPY --from=build --chown=0:0 --chmod=0755 /out/${TARGETARCH}/dbop /usr/local/bin/dbop
COPY --from=build --chown=0:0 --chmod=0755 /out/${TARGETARCH}/dbop-instance /usr/local/bin/dbop-instance
COPY --from=build --chown=0:0 --chmod=0755 /out/${TARGETARCH}/dbop-backup /usr/local/bin/dbop-backup
# busybox runs the applet named by argv[0]: installed as `cp`, it is `cp`.
COPY --from=build --chown=0:0 --chmod=0755 /out/${TARGETARCH}/cp /usr/bin/cp

# distroless's `nonroot` user; numeric so that runAsNonRoot can verify it.
USER 65532:65532

ENTRYPOINT ["/usr/local/bin/dbop"]
CMD ["run"]
