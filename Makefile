# Two entry points for people and CI: `make run` and `make test`. Both bootstrap and build first.
BUILD ?= build
BUILD_ASAN ?= build-asan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all bootstrap build run test asan clean

all: build

bootstrap:
	@./scripts/bootstrap

build: bootstrap
	@cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Runs mxserve on the bundled tiny model until the HTTP server lands (issue: OpenAI-compatible server).
run: build
	./$(BUILD)/mxserve generate --model tests/fixtures/tiny-gpt-oss --backend cpu --prompt-ids 1,2,3,4 --max-new-tokens 16

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer, CPU only.
asan: bootstrap
	@cmake -S . -B $(BUILD_ASAN) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMX_SANITIZE=ON -DMX_CUDA=OFF >/dev/null
	@cmake --build $(BUILD_ASAN) -j $(JOBS)
	@cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN)
