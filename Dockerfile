# syntax=docker/dockerfile:1
# relaylet's container image: a release build of the product crate alone (the sandbox and the
# benchmark live in the workspace's relaylet-dev crate, never in the image), on distroless/cc:
# glibc and libgcc only, no shell, no package manager, non-root.
# ring and rustls need nothing else (no OpenSSL).
#
#   docker build -t relaylet:dev --build-arg VERSION=0.1.0 .
#   docker buildx build --platform linux/arm64 -t relaylet:dev-arm64 --build-arg VERSION=0.1.0 .

ARG RUST_VERSION=1.95

# Debian 12 (bookworm) to match the runtime image's glibc: a binary linked against a newer glibc
# would not start there. The build stage runs on the building machine's platform and
# cross-compiles for the image's (`--platform linux/arm64`; docker buildx sets BUILDPLATFORM and
# TARGETARCH, podman 4.3 only TARGETARCH, so tests/tools/build-image.sh passes BUILDPLATFORM), so
# an arm64 image needs no emulator to build; amd64 and arm64 are the platforms built.
FROM --platform=$BUILDPLATFORM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
ARG TARGETARCH
WORKDIR /src

# The Rust target of TARGETARCH; for arm64 Debian's cross C compiler and linker with bookworm's
# arm64 glibc (ring compiles C and assembly). The toolchain must hold the target's standard
# library (`rustup target add aarch64-unknown-linux-gnu`).
ENV CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
RUN case "$TARGETARCH" in \
      amd64) echo x86_64-unknown-linux-gnu > /rust-target ;; \
      arm64) echo aarch64-unknown-linux-gnu > /rust-target \
        && apt-get update \
        && apt-get install -y --no-install-recommends \
            gcc-aarch64-linux-gnu=4:12.2.0-3 libc6-dev-arm64-cross=2.36-8cross1 \
        && rm -rf /var/lib/apt/lists/* ;; \
      *) echo "TARGETARCH '$TARGETARCH': relaylet's image is built for amd64 and arm64" >&2 && exit 1 ;; \
    esac

# Dependencies first, in their own layer: rebuilt only when a manifest or Cargo.lock changes.
# The workspace needs every member's manifest; stub sources stand in for the code. relaylet-sim
# and relaylet-dev are only tests' and developers' crates, so their stubs are all this image
# ever needs of them.
COPY Cargo.toml Cargo.lock ./
COPY sim/Cargo.toml sim/Cargo.toml
COPY dev/Cargo.toml dev/Cargo.toml
RUN mkdir -p src sim/src dev/src \
    && echo 'fn main() {}' > src/main.rs \
    && echo 'fn main() {}' > dev/src/main.rs \
    && touch src/lib.rs sim/src/lib.rs dev/src/lib.rs \
    && cargo build --release --locked --package relaylet --target "$(cat /rust-target)" \
    && out="target/$(cat /rust-target)/release" \
    && rm -rf src "$out/relaylet" "$out"/deps/relaylet-* "$out"/deps/librelaylet-* \
        "$out"/.fingerprint/relaylet-*

# The code. Touch it so cargo never mistakes it for the stubs built above. `relaylet join`
# embeds the leaf manifests.
COPY deploy/leaf-rbac.yaml deploy/leaf-rbac-namespaced.yaml deploy/leaf-rbac-exec-only.yaml deploy/
COPY src src
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --package relaylet --target "$(cat /rust-target)" \
    && install -D -m 0755 "target/$(cat /rust-target)/release/relaylet" /out/relaylet

# The runtime base of the image's platform (--platform here too: podman 4.3 otherwise resolves
# this FROM with the build stage's platform and puts the arm64 binary on the amd64 base).
# hadolint ignore=DL3065
FROM --platform=$TARGETPLATFORM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="relaylet" \
      org.opencontainers.image.description="The kubelet of virtual nodes: kubectl exec, attach, port-forward and logs for pods in leaf clusters" \
      org.opencontainers.image.source="https://github.com/relaylet/relaylet" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/relaylet /usr/local/bin/relaylet
# distroless' nonroot user; the Helm chart runs as the same uid with a read-only root.
USER 65532:65532
EXPOSE 10250 9090
ENTRYPOINT ["/usr/local/bin/relaylet"]
CMD ["serve"]
