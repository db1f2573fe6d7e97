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

.PHONY: all deps build build-asan build-fuzz run test test-release test-asan fuzz bench clean

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

build-asan: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DROCMFORGE_SANITIZE=ON -DROCMFORGE_BENCH=OFF $(CMAKE_FLAGS)
	cmake --build build-asan -j $(JOBS)

build-fuzz: deps
	cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
	  -DCMAKE_CXX_COMPILER=clang++ -DROCMFORGE_SANITIZE=ON -DROCMFORGE_FUZZ=ON -DROCMFORGE_TESTS=OFF \
	  -DROCMFORGE_BENCH=OFF -DROCMFORGE_GPU=off $(CMAKE_FLAGS)
	cmake --build build-fuzz -j $(JOBS) --target fuzz_targets

run: build
	build/bin/rocmforge inspect $(MODEL)

test: test-release test-asan fuzz

test-release: build
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan: build-asan
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

# Each fuzz target runs FUZZ_SECONDS; the shared model and vocabulary files seed it (read-only corpus
# folders after the writable one; libFuzzer cuts each to max_len, so truncated headers are seeds too).
fuzz: build-fuzz
	@set -e; for f in build-fuzz/bin/fuzz_*; do \
	  name=$$(basename $$f); corpus=build-fuzz/corpus/$$name; mkdir -p $$corpus; \
	  echo "== $$name for $(FUZZ_SECONDS) s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
	    $$corpus $(SHARED)/models $(SHARED)/vocab; \
	done

bench: build
	@for b in build/bin/bench_*; do $$b; done

clean:
	rm -rf build build-asan build-fuzz
