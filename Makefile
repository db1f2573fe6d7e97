# Thin front over CMake. Every target first installs the Debian packages that are missing.
SHELL := /bin/bash
JOBS ?= $(shell nproc)
SHARED ?= ../shared
MODEL ?= $(SHARED)/models/stories260K.gguf
FUZZ_SECONDS ?= 60
CMAKE_FLAGS ?=
ifeq ($(CI),true)
CMAKE_FLAGS += -DROCMFORGE_WERROR=ON
endif

PACKAGES := cmake ninja-build g++ clang libclang-rt-14-dev pkg-config nlohmann-json3-dev libcpp-httplib-dev \
            libcli11-dev libspdlog-dev libfmt-dev libpcre2-dev libgtest-dev libbenchmark-dev

.PHONY: all deps build build-asan build-fuzz build-cuda build-hip run test test-release test-asan openai-client fuzz bench \
        clean

all: build

deps:
	@missing=$$(for p in $(PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "Installing missing packages: $$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi

build: deps
	cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build build -j $(JOBS)

# Without the GPU backend: its kernels cannot run where the sanitizers do, and build-cuda compile-checks them.
build-asan: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DROCMFORGE_SANITIZE=ON -DROCMFORGE_BENCH=OFF \
	  -DROCMFORGE_GPU=off $(CMAKE_FLAGS)
	cmake --build build-asan -j $(JOBS)

build-fuzz: deps
	cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
	  -DCMAKE_CXX_COMPILER=clang++ -DROCMFORGE_SANITIZE=ON -DROCMFORGE_FUZZ=ON -DROCMFORGE_TESTS=OFF \
	  -DROCMFORGE_BENCH=OFF -DROCMFORGE_GPU=off $(CMAKE_FLAGS)
	cmake --build build-fuzz -j $(JOBS) --target fuzz_targets

# Compile checks of the GPU backend, one source set for both vendors (compile and link: CI has no GPU).
# build-cuda builds with nvcc; build-hip with hipcc from Debian's ROCm (hipcc, libamdhip64-dev: installed
# here when missing). Each says SKIPPED instead of failing when its compiler cannot be had. build-hip also
# builds with CMake's default generator, Unix Makefiles (named, so that CMAKE_GENERATOR cannot change it), which
# treats hipcc's custom commands its own way; for one target, gfx90a, as the Ninja build covers every one.
GPU_CHECK_FLAGS := -DCMAKE_BUILD_TYPE=Release -DROCMFORGE_TESTS=OFF -DROCMFORGE_BENCH=OFF $(CMAKE_FLAGS)

build-cuda: deps
	@if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then \
	  set -e; \
	  cmake -S . -B build-cuda -DROCMFORGE_GPU=cuda -DCMAKE_CUDA_COMPILER=$$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) \
	    -G Ninja $(GPU_CHECK_FLAGS); \
	  cmake --build build-cuda -j $(JOBS) --target rocmforge; \
	else echo "build-cuda: SKIPPED: nvcc (the CUDA toolkit) is not installed"; fi

build-hip: deps
	@if ! command -v hipcc >/dev/null || ! dpkg-query -W -f='$${Status}' libamdhip64-dev 2>/dev/null | grep -q 'ok installed'; then \
	  echo "Installing hipcc libamdhip64-dev for the HIP compile check"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $$SUDO apt-get install -y -q hipcc libamdhip64-dev || \
	    ($$SUDO apt-get update -q && $$SUDO apt-get install -y -q hipcc libamdhip64-dev) || true; \
	fi
	@if command -v hipcc >/dev/null; then \
	  set -e; \
	  cmake -S . -B build-hip -DROCMFORGE_GPU=hip -G Ninja $(GPU_CHECK_FLAGS); \
	  cmake --build build-hip -j $(JOBS) --target rocmforge; \
	  cmake -S . -B build-hip-make -DROCMFORGE_GPU=hip -G "Unix Makefiles" -DROCMFORGE_HIP_ARCHITECTURES=gfx90a \
	    $(GPU_CHECK_FLAGS); \
	  cmake --build build-hip-make -j $(JOBS) --target rocmforge; \
	else echo "build-hip: SKIPPED: hipcc could not be installed (apt-get install hipcc libamdhip64-dev)"; fi

run: build
	build/bin/rocmforge run -m $(MODEL) -p "Once upon a time" -n 64

test: test-release test-asan fuzz build-cuda build-hip

test-release: build openai-client
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan: build-asan openai-client
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

# OpenAI's Node client, which tests/server/openai_client_test.cpp runs against `rocmforge serve`: installed from its
# package-lock.json when missing or older than the lock file. Without npm, or where npm ci fails, that test skips; a
# machine without the registry gives up after a minute or two rather than npm's default five minutes a try.
OPENAI_CLIENT := tests/server/openai_client

openai-client:
	@if [ -f $(OPENAI_CLIENT)/node_modules/.package-lock.json ] && \
	    [ ! $(OPENAI_CLIENT)/package-lock.json -nt $(OPENAI_CLIENT)/node_modules/.package-lock.json ]; then :; \
	elif ! command -v npm >/dev/null; then \
	  echo "openai-client: npm is not installed: the OpenAI client test skips (it needs Node.js 20 or later and npm)"; \
	else \
	  npm ci --prefix $(OPENAI_CLIENT) --no-audit --no-fund --fetch-timeout=60000 --fetch-retries=1 || \
	    echo "openai-client: npm ci failed: the OpenAI client test skips"; \
	fi

# Each fuzz target runs FUZZ_SECONDS; the shared model and vocabulary files seed it (read-only corpus
# folders after the writable one; libFuzzer cuts each to max_len, so truncated headers are seeds too).
fuzz: build-fuzz
	@set -e; for f in build-fuzz/bin/fuzz_*; do \
	  name=$$(basename $$f); corpus=build-fuzz/corpus/$$name; mkdir -p $$corpus; \
	  echo "== $$name for $(FUZZ_SECONDS) s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
	    -artifact_prefix=build-fuzz/ \
	    $$corpus $(SHARED)/models $(SHARED)/vocab; \
	done

bench: build
	@for b in build/bin/bench_*; do $$b; done

clean:
	rm -rf build build-asan build-fuzz build-cuda build-hip build-hip-make
