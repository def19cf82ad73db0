# normd container image: `docker build -t normd .` (or podman/buildah).
#
# Two stages from debian:bookworm: the build stage compiles normd and normctl
# from Debian's -dev packages; the runtime stage holds only their runtime
# libraries and the two binaries, and runs as the non-root user `normd`
# (uid 10001). State (--state_dir) goes to the volume /var/lib/normd; without
# the flag normd keeps models in memory only.
#
#   docker run -p 50051:50051 -p 8000:8000 -p 9464:9464 normd
#   docker run -v normd-state:/var/lib/normd normd --state_dir=/var/lib/normd
#
# tests/deploy/container_test.py builds this file with podman and smoke-runs the
# image as its non-root user (`make test-container`).

FROM debian:bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      cmake make g++ pkg-config zlib1g-dev \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libabsl-dev libtbb-dev prometheus-cpp-dev libhwy-dev \
      libboost-dev libssl-dev libsimdjson-dev libonnx-dev \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY proto proto
COPY server server
COPY client client
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release \
      -DNORMD_BUILD_TESTS=OFF -DNORMD_BUILD_BENCH=OFF \
 && cmake --build /build -j"$(nproc)" --target normd normctl \
 && install -s -m 0755 /build/normd /build/normctl /usr/local/bin/

FROM debian:bookworm AS runtime
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libtbb12 \
      libprometheus-cpp-pull1.0 libhwy1 zlib1g libssl3 \
      libsimdjson14 libonnx1 \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 normd \
 && useradd --uid 10001 --gid normd --no-create-home \
      --home-dir /var/lib/normd --shell /usr/sbin/nologin normd \
 && install -d -o normd -g normd -m 0750 /var/lib/normd
COPY --from=build /usr/local/bin/normd /usr/local/bin/normctl /usr/local/bin/
USER 10001:10001
WORKDIR /var/lib/normd
VOLUME ["/var/lib/normd"]
EXPOSE 50051 8000 9464
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["/usr/local/bin/normctl", "--server=127.0.0.1:50051", \
       "--connect_timeout=2s", "--timeout=2s", "health"]
ENTRYPOINT ["/usr/local/bin/normd", "--port=50051", "--http_port=8000", \
            "--metrics_port=9464"]
