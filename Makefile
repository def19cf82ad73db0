# normd: `make run` and `make test` work on a fresh Debian 12 machine; both first
# install any missing Debian package (apt-get; sudo when not root).
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
PORT ?= 50051
METRICS_PORT ?= 9464

# C++ toolchain and libraries, and the Python side of the cross-language tests
# (Debian's python3-torch / python3-grpcio, run with /usr/bin/python3).
DEB_PACKAGES := cmake make g++ pkg-config curl clang-format \
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
  libabsl-dev libtbb-dev prometheus-cpp-dev libgtest-dev libgmock-dev \
  libbenchmark-dev python3 python3-torch python3-grpcio python3-protobuf \
  python3-numpy openssl

.PHONY: all deps build test run clean format bench

all: build

deps:
	@missing=$$(for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; \
	done); \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing" $$missing; \
	  sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BUILD_DIR)/Makefile: CMakeLists.txt tests/CMakeLists.txt
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: deps $(BUILD_DIR)/Makefile
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Every test: core, end-to-end against a real normd, the PyTorch cross-check,
# the concurrency proof.
test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900

# Starts normd in the foreground with in-memory state; Ctrl-C stops it.
run: build
	$(BUILD_DIR)/normd --port=$(PORT) --metrics_port=$(METRICS_PORT)

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD_DIR)

# One run, two tables: kernels vs copy / read-only-sum baselines and PyTorch;
# the service (loopback) vs a raw gRPC echo and the Python peer. Medians of
# BENCH_REPS runs each; about 5 minutes.
BENCH_REPS ?= 5
SERVICE_REPS ?= 3
bench: build
	$(BUILD_DIR)/bench/kernel_bench --benchmark_repetitions=$(BENCH_REPS) \
	  --benchmark_report_aggregates_only=true --benchmark_format=json \
	  --benchmark_out=$(BUILD_DIR)/kernel_bench.json --benchmark_out_format=json > /dev/null
	/usr/bin/python3 bench/torch_bench.py $(BENCH_REPS) > $(BUILD_DIR)/torch_bench.json
	/usr/bin/python3 bench/service_bench.py --build $(BUILD_DIR) \
	  --reps $(SERVICE_REPS) > $(BUILD_DIR)/service_bench.json
	/usr/bin/python3 bench/report.py $(BUILD_DIR)/kernel_bench.json \
	  $(BUILD_DIR)/torch_bench.json $(BUILD_DIR)/service_bench.json
