# Thin wrapper around CMake/CTest (CMakeLists.txt is the source of truth).
# `make test` and `make demo` each do the whole set-up on a fresh machine.
BUILD ?= build
# `make demo` builds only the rlhf binary, without CUDA (no backend, no emulator, no tests) and
# with precompiled headers, here.
DEMO_BUILD ?= build-demo
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps test-deps configure build test demo demo-real demo-build bench fmt clean

all: build

deps:
	@bash scripts/install-deps.sh

test-deps:
	@bash scripts/install-deps.sh --test

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: test-deps build
	cd $(BUILD) && ctest --output-on-failure --timeout 1200

demo-build: deps
	cmake -S . -B $(DEMO_BUILD) -DRLHF_CUDA=OFF -DRLHF_CUDA_EMU=OFF -DRLHF_PCH=ON $(CMAKE_FLAGS)
	cmake --build $(DEMO_BUILD) -j $(JOBS) --target rlhf

demo: demo-build
	bash scripts/demo.sh $(DEMO_BUILD)/rlhf

# GRPO on a real chat model (SmolLM2-135M-Instruct, fetched by scripts/get_model.sh).
demo-real: demo-build
	bash scripts/demo_real.sh $(DEMO_BUILD)/rlhf

bench: build
	$(BUILD)/rlhf bench all

fmt:
	git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(DEMO_BUILD)
