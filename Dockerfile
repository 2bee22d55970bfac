# Multi-stage build: compile with the full toolchain, run on a slim base as a
# non-root user. Build context: the repository root (see .dockerignore).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY tests ./tests
COPY benches ./benches
COPY config ./config
# A workspace member: cargo loads every member's manifest and targets.
COPY loadtest/Cargo.toml ./loadtest/Cargo.toml
COPY loadtest/src ./loadtest/src
# The commit `hourglass --version` names (the context has no .git):
#   docker build --build-arg HOURGLASS_COMMIT=$(git rev-parse --short=12 HEAD) .
ARG HOURGLASS_COMMIT=unknown
RUN HOURGLASS_COMMIT=$HOURGLASS_COMMIT cargo build --release --locked --bin hourglass

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin hourglass \
 && mkdir -p /var/lib/hourglass/journal \
 && chown -R hourglass /var/lib/hourglass
COPY --from=build /src/target/release/hourglass /usr/local/bin/hourglass
COPY config/docker.toml /etc/hourglass/hourglass.toml
USER hourglass
# Acknowledged readings wait here for their bucket writes: mount a volume.
VOLUME /var/lib/hourglass/journal
ENV HOURGLASS__JOURNAL__DIR=/var/lib/hourglass/journal
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/hourglass"]
CMD ["--config", "/etc/hourglass/hourglass.toml"]
