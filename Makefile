# Thin wrapper around CMake/CTest (CMakeLists.txt is the source of truth).
# `make test` and `make demo` each do the whole set-up on a fresh machine.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test demo bench fmt clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 1200

demo: build
	bash scripts/demo.sh $(BUILD)/rlhf

bench: build
	$(BUILD)/rlhf bench all

fmt:
	git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD)
