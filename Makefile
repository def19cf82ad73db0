# normd: `make run` and `make test` work on a fresh Debian 12 machine; both first
# install any missing Debian package (apt-get; sudo when not root).
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
# ctest runs twice as many tests as cores in the main and ASan suites: most
# end-to-end tests wait on a server, a socket or a timeout, so at JOBS the
# cores sat half idle (main suite at -j2: 47% of two cores, 327 s; at -j4:
# 81%, 174 s; ASan 407 s -> 314 s).
CTEST_JOBS ?= $(shell echo $$(( 2 * $(JOBS) )))
PORT ?= 50051
METRICS_PORT ?= 9464
HTTP_PORT ?= 8000

# C++ toolchain and libraries, and the Python side of the cross-language tests
# (Debian's python3-torch / python3-grpcio, run with /usr/bin/python3).
DEB_PACKAGES := cmake make g++ pkg-config curl clang-format \
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
  libabsl-dev libtbb-dev prometheus-cpp-dev libgtest-dev libgmock-dev \
  libbenchmark-dev python3 python3-torch python3-grpcio python3-protobuf \
  python3-numpy python3-pip python3-setuptools python3-yaml openssl clang \
  libclang-rt-14-dev prometheus haproxy python3-venv libhwy-dev \
  libboost-dev libssl-dev libsimdjson-dev python3-requests libonnx-dev \
  python3-onnx python3-torchvision python3-tqdm

.PHONY: all deps build test test-main test-asan test-tsan fuzz run clean \
  format bench test-container test-arm64 check-manifests fuzz-corpus

all: build

# Installs whichever of the packages in $(1) are missing (sudo when not root).
define install_missing
	@missing=$$(for p in $(1); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; \
	done); \
	if [ -n "$$missing" ]; then \
	  echo "make: installing" $$missing; \
	  sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing; \
	fi
endef

# npm packages of the tests (lockfiles committed): installed with `npm ci`
# unless node_modules is newer than the lockfile.
NPM_DIRS := tests/deploy/k8s client/node

deps:
	$(call install_missing,$(DEB_PACKAGES))
	@for d in $(NPM_DIRS); do \
	  [ $$d/node_modules/.package-lock.json -nt $$d/package-lock.json ] || \
	  npm ci --prefix $$d --no-audit --no-fund --loglevel=error || exit 1; \
	done

# RelWithDebInfo with line tables only (-g1): backtraces keep file and line,
# and the build takes about a quarter less time than with full -g (CI's
# budget); `cmake` run by hand keeps CMake's own -g. The main, ASan and
# ARM64 builds use it.
RELWITHDEBINFO_O2_G1 := '-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG'
$(BUILD_DIR)/Makefile: CMakeLists.txt $(wildcard tests/CMakeLists.txt tests/*/CMakeLists.txt)
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  $(RELWITHDEBINFO_O2_G1)

build: deps $(BUILD_DIR)/Makefile
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Every test: the suite (core, end-to-end against a real normd, the PyTorch
# cross-check, the concurrency proof, durability, overload, security), then
# the suite again under ASan+UBSan, the concurrency tests under TSan, and
# each fuzz target for FUZZ_SECONDS, then the ARM64 build under qemu. Each
# stage in turn, its wall time printed (CI's budget is 45 minutes in all).
TEST_STAGES ?= test-main test-asan test-tsan fuzz test-arm64
test:
	@for stage in $(TEST_STAGES); do \
	  start=$$(date +%s); \
	  $(MAKE) --no-print-directory $$stage || exit 1; \
	  echo "make test: $$stage took $$(( $$(date +%s) - start )) s"; \
	done

test-main: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(CTEST_JOBS) --timeout 900

# Sanitizer builds: Debian's libraries are not instrumented; ours are. Each
# has its own build tree (no benchmarks). ASan+UBSan is clang's, with
# libFuzzer's coverage: one instrumented build runs the suite (test-asan)
# and the fuzz targets (fuzz). Its -O2 with line tables only (-g1: enough
# for the reports' stacks) compiles faster than GCC's instrumented -O1.
# TSan (GCC, -O1 -g1: GCC took twice as long at -O2 -g) runs the in-process
# concurrency tests (label tsan: the model store, the durable state and the
# engine under racing threads): gRPC, oneTBB and Abseil synchronize in code
# TSan cannot see, so a server under TSan would only report their handoffs
# (server/core/sync.h makes normd's own mutexes visible to it).
# Fewer SIMD targets there (NORMD_SIMD_SKIP, CMakeLists.txt): each target
# compiles every kernel again, which is most of an instrumented build. ASan,
# TSan and the fuzzers run AVX2 and the scalar fallback: the two whose tails
# go through padded copies rather than masked loads and stores, and a
# choice for Highway's dispatch. AVX3 and SSE4 run in the main suite.
SANITIZER_SIMD_SKIP = HWY_SSE4|HWY_AVX3
ASAN_CMAKE = -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DNORMD_BUILD_BENCH=OFF $(RELWITHDEBINFO_O2_G1) \
  -DNORMD_SANITIZE=address,undefined -DNORMD_FUZZ=ON \
  '-DNORMD_SIMD_SKIP=$(SANITIZER_SIMD_SKIP)'
TSAN_CMAKE = -DCMAKE_CXX_COMPILER=g++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DNORMD_BUILD_BENCH=OFF '-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG' \
  -DNORMD_SANITIZE=thread '-DNORMD_SIMD_SKIP=$(SANITIZER_SIMD_SKIP)'
ASAN_BUILD_DIR ?= build-asan
TSAN_BUILD_DIR ?= build-tsan
FUZZ_SECONDS ?= 25
FUZZ_TARGETS := rpc rest http state npy ops safetensors onnx

test-asan: deps
	cmake -S . -B $(ASAN_BUILD_DIR) $(ASAN_CMAKE)
	cmake --build $(ASAN_BUILD_DIR) -j $(JOBS)
	cd $(ASAN_BUILD_DIR) && \
	  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizers/lsan.supp \
	  ctest --output-on-failure -j $(CTEST_JOBS) --timeout 900 \
	  -LE 'pytorch|install'

test-tsan: deps
	cmake -S . -B $(TSAN_BUILD_DIR) $(TSAN_CMAKE)
	cmake --build $(TSAN_BUILD_DIR) -j $(JOBS) --target state_test
	cd $(TSAN_BUILD_DIR) && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --output-on-failure -j $(JOBS) --timeout 900 -L tsan

# libFuzzer: each target for FUZZ_SECONDS from the seed corpus in
# tests/fuzz/corpus, in the ASan build tree (built there by test-asan, or
# here), JOBS targets at a time (a fuzzer runs on one core; each one's
# output is printed whole when it ends); new inputs go to
# $(ASAN_BUILD_DIR)/corpus, crashes to $(ASAN_BUILD_DIR)/<target>-crash-*
# (add them to tests/fuzz/regressions).
fuzz: deps
	cmake -S . -B $(ASAN_BUILD_DIR) $(ASAN_CMAKE)
	cmake --build $(ASAN_BUILD_DIR) -j $(JOBS) \
	  --target $(addsuffix _fuzzer,$(FUZZ_TARGETS))
	$(MAKE) --no-print-directory -j $(JOBS) --output-sync=target \
	  $(addprefix fuzz-run-,$(FUZZ_TARGETS))

# One fuzz target's run (see fuzz).
fuzz-run-%:
	mkdir -p $(ASAN_BUILD_DIR)/corpus/$*
	$(ASAN_BUILD_DIR)/$*_fuzzer -max_total_time=$(FUZZ_SECONDS) \
	  -max_len=8192 -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
	  -artifact_prefix=$(ASAN_BUILD_DIR)/$*- \
	  $(ASAN_BUILD_DIR)/corpus/$* tests/fuzz/corpus/$*

# Keeps what fuzzing found: merges each target's $(ASAN_BUILD_DIR)/corpus
# (from `make fuzz`, longer with FUZZ_SECONDS=600) into tests/fuzz/corpus
# with libFuzzer's -merge=1, which copies only the inputs that reach new
# coverage, so the committed corpus grows minimized. Commit the new files.
fuzz-corpus:
	for t in $(FUZZ_TARGETS); do \
	  [ -d $(ASAN_BUILD_DIR)/corpus/$$t ] || continue; \
	  before=$$(ls tests/fuzz/corpus/$$t | wc -l); \
	  $(ASAN_BUILD_DIR)/$${t}_fuzzer -merge=1 tests/fuzz/corpus/$$t \
	    $(ASAN_BUILD_DIR)/corpus/$$t 2> /dev/null || exit 1; \
	  echo "$$t: $$before -> $$(ls tests/fuzz/corpus/$$t | wc -l) inputs"; \
	done

# ARM64: the core, its unit tests and normd cross-built with Debian's
# g++-aarch64-linux-gnu against the :arm64 dev packages (multiarch), with
# line tables only as in the main build (full -g costs CI's budget most on
# the Beast front end), then run under qemu-user-static: the core's tests
# once as a NEON CPU (cortex-a72) and once as `-cpu max` (SVE), leaving out
# the slowest (ARM64_SKIP_TESTS, tests/core/CMakeLists.txt); then
# tests/deploy/arm64_smoke.py checks the ARM64 normd's bytes against this
# machine's normd.
ARM64_BUILD_DIR ?= build-arm64
ARM64_PACKAGES := g++-aarch64-linux-gnu qemu-user-static libhwy-dev:arm64 \
  libabsl-dev:arm64 libtbb-dev:arm64 libgtest-dev:arm64 libgrpc++-dev:arm64 \
  libprotobuf-dev:arm64 libprometheus-cpp-pull1.0:arm64 zlib1g-dev:arm64 \
  libboost-dev:arm64 libssl-dev:arm64 libsimdjson14:arm64
test-arm64: build
	@dpkg --print-foreign-architectures | grep -qx arm64 || \
	  $$( [ "$$(id -u)" = 0 ] || echo sudo ) dpkg --add-architecture arm64
	$(call install_missing,$(ARM64_PACKAGES))
	cmake -S . -B $(ARM64_BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  $(RELWITHDEBINFO_O2_G1) \
	  -DCMAKE_TOOLCHAIN_FILE=$(CURDIR)/.ci/aarch64-linux-gnu.cmake \
	  -DNORMD_BUILD_BENCH=OFF
	cmake --build $(ARM64_BUILD_DIR) -j $(JOBS) --target normd core_tests
	cd $(ARM64_BUILD_DIR) && QEMU_CPU=cortex-a72 \
	  ctest --output-on-failure -j $(JOBS) --timeout 900 -L core
	cd $(ARM64_BUILD_DIR) && QEMU_CPU=max \
	  ctest --output-on-failure -j $(JOBS) --timeout 900 -L core
	/usr/bin/python3 tests/deploy/arm64_smoke.py --normd $(BUILD_DIR)/normd \
	  --normctl $(BUILD_DIR)/normctl --normd_arm64 $(ARM64_BUILD_DIR)/normd

# The deployment manifests, offline (no cluster): deploy/k8s renders with
# kubectl kustomize and validates against the Kubernetes and
# prometheus-operator schemas, deploy/kserve's InferenceServices against the
# Pod schema and normd's own flags, the sharded overlay's HAProxy config
# with haproxy -c. The same test as ctest's k8s_manifests.
check-manifests: build
	/usr/bin/python3 tests/deploy/k8s_test.py --normd $(BUILD_DIR)/normd

# The Dockerfile, built with podman (no Docker engine needed) and smoke-run
# as the image's non-root user; needs root (podman storage, chroot). The
# debian:bookworm base is made once with debootstrap. See
# tests/deploy/container_test.py.
CONTAINER_PACKAGES := podman buildah debootstrap
test-container: build
	$(call install_missing,$(CONTAINER_PACKAGES))
	mkdir -p $(BUILD_DIR)/container
	$$( [ "$$(id -u)" = 0 ] || echo sudo ) /usr/bin/python3 \
	  tests/deploy/container_test.py --normd $(BUILD_DIR)/normd \
	  --stubs $(BUILD_DIR)/python --work $(CURDIR)/$(BUILD_DIR)/container

# Builds only normd and normctl (not the tests, benchmarks or fuzzers), then
# starts normd in the foreground with in-memory state; Ctrl-C stops it.
run: deps $(BUILD_DIR)/Makefile
	cmake --build $(BUILD_DIR) -j $(JOBS) --target normd normctl
	$(BUILD_DIR)/normd --port=$(PORT) --http_port=$(HTTP_PORT) \
	  --metrics_port=$(METRICS_PORT)

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD_DIR) $(ASAN_BUILD_DIR) $(TSAN_BUILD_DIR) $(ARM64_BUILD_DIR)

# One run, two tables: kernels vs copy / read-only-sum baselines and PyTorch;
# the service (loopback) vs a raw gRPC echo and the Python peer. Medians of
# BENCH_REPS runs each; about 8 minutes. The kernels' KERNEL_REPS repetitions
# run in random order across benchmarks, and every kernel iteration follows a
# run of its baseline whose time is kept beside it: a shared machine's drift
# in memory bandwidth reaches both, and report.py takes their ratio.
BENCH_REPS ?= 5
KERNEL_REPS ?= 9
SERVICE_REPS ?= 3
bench: build
	$(BUILD_DIR)/bench/kernel_bench --benchmark_repetitions=$(KERNEL_REPS) \
	  --benchmark_min_time=0.2 --benchmark_enable_random_interleaving=true \
	  --benchmark_display_aggregates_only=true --benchmark_format=json \
	  --benchmark_out=$(BUILD_DIR)/kernel_bench.json --benchmark_out_format=json > /dev/null
	/usr/bin/python3 bench/torch_bench.py $(BENCH_REPS) > $(BUILD_DIR)/torch_bench.json
	/usr/bin/python3 bench/service_bench.py --build $(BUILD_DIR) \
	  --reps $(SERVICE_REPS) > $(BUILD_DIR)/service_bench.json
	/usr/bin/python3 bench/report.py $(BUILD_DIR)/kernel_bench.json \
	  $(BUILD_DIR)/torch_bench.json $(BUILD_DIR)/service_bench.json
	/usr/bin/python3 bench/durable_bench.py --build $(BUILD_DIR) --reps $(BENCH_REPS)
	/usr/bin/python3 bench/checkpoint_bench.py --build $(BUILD_DIR) --reps $(BENCH_REPS)
	$(BUILD_DIR)/bench/shape_survey --reps=$(KERNEL_REPS)
