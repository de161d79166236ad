# Two entry points for people and CI: `make run` and `make test`. Both bootstrap and build first.
BUILD ?= build
BUILD_ASAN ?= build-asan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# CI builds the CUDA code for Hopper, Blackwell and RTX Blackwell / DGX Spark so that nothing arch-specific
# leaks into portable code (no GPU needed to compile). Device runs use `make build-gpu`.
CUDA_ARCHS ?= 90a;100a;120a
# `make test` only proves that the device code compiles (CI has no GPU to run it): it compiles it, the GPU tests
# and the kernel benchmarks fast and unoptimized (MX_CUDA_FAST_COMPILE, about half of their compile time).
# `make build`/`run`/`compile` and build-gpu compile them optimized, for binaries that run kernels.
CUDA_FAST_COMPILE ?= OFF
BUILD_GPU ?= build-gpu

.PHONY: all bootstrap build compile build-gpu gpu-bundle run test asan clean

all: build

bootstrap:
	@./scripts/bootstrap

build: bootstrap
	@$(MAKE) --no-print-directory compile

# Binaries to carry to a GPU machine: sm_90a only, libstdc++/libgcc linked statically, no libzmq (KV events off).
build-gpu: bootstrap
	@cmake -S . -B $(BUILD_GPU) -G Ninja -DMX_CUDA=ON -DMX_CUDA_ARCHS=90a -DMX_STATIC_RUNTIME=ON -DMX_KV_EVENTS=OFF $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD_GPU) -j $(JOBS) --target mxserve mx_gpu_tests mx_kernel_bench mx_all_reduce_bench

# build-gpu plus the run script in one folder (default .devgpu/): `cd .devgpu && ./run.sh` on the GPU machine,
# from the repository root of a checkout (the fixtures are read from tests/fixtures).
GPU_BUNDLE ?= .devgpu
gpu-bundle: build-gpu
	@mkdir -p $(GPU_BUNDLE)
	@cp $(BUILD_GPU)/mxserve $(BUILD_GPU)/mx_gpu_tests $(BUILD_GPU)/mx_kernel_bench $(BUILD_GPU)/mx_all_reduce_bench tests/gpu/run.sh $(GPU_BUNDLE)/

# Serves the demo model (random weights, real tokenizer; made once in ~/.cache/mxserve) on the CPU at
# http://127.0.0.1:8000 until Ctrl-C.
run: build
	./$(BUILD)/mxserve serve

# CI's clock (20 minutes for a clean clone, docs/TESTING.md): the npm test peers, which only the tests need,
# download while the code compiles.
test:
	@./scripts/bootstrap packages
	@./scripts/bootstrap npm-peers & peers=$$!; $(MAKE) --no-print-directory compile CUDA_FAST_COMPILE=ON; built=$$?; \
	  wait $$peers; exit $$built
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

compile:
	@cmake -S . -B $(BUILD) -G Ninja -DMX_CUDA_ARCHS="$(CUDA_ARCHS)" -DMX_CUDA_FAST_COMPILE=$(CUDA_FAST_COMPILE) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer, CPU only.
asan: bootstrap
	@cmake -S . -B $(BUILD_ASAN) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMX_SANITIZE=ON -DMX_CUDA=OFF >/dev/null
	@cmake --build $(BUILD_ASAN) -j $(JOBS)
	@cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_GPU)
