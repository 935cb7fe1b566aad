# syntax=docker/dockerfile:1
# relaylet's container image: a release build of the product crate alone (the sandbox and the
# benchmark live in the workspace's relaylet-dev crate, never in the image), on distroless/cc:
# glibc and libgcc only, no shell, no package manager, non-root.
# ring and rustls need nothing else (no OpenSSL).
#
#   docker build -t relaylet:dev --build-arg VERSION=0.1.0 .

ARG RUST_VERSION=1.95

# Debian 12 (bookworm) to match the runtime image's glibc: a binary linked against a newer glibc
# would not start there.
FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src

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
    && cargo build --release --locked --package relaylet \
    && rm -rf src target/release/relaylet target/release/deps/relaylet-* \
        target/release/deps/librelaylet-* target/release/.fingerprint/relaylet-*

# The code. Touch it so cargo never mistakes it for the stubs built above. `relaylet join`
# embeds the leaf manifest.
COPY deploy/leaf-rbac.yaml deploy/leaf-rbac.yaml
COPY src src
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --package relaylet \
    && install -D -m 0755 target/release/relaylet /out/relaylet

FROM gcr.io/distroless/cc-debian12:nonroot
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
