# mk/cuda.mk - CUDA kernels and GPU benchmarks, built only where nvcc is.
#
# Included at the end of the Makefile (`-include mk/cuda.mk`): when the CUDA
# toolkit is found, `make` (target all) also builds
#   $(KDIR)/cuda_basic.so       the "cuda_basic" kernel library
#   $(KDIR)/cuda_mlp.so         the "cuda_mlp" kernel library (examples/train.lua on GPUs)
#   $(BUILD)/bench/gpu_dispatch the bare-CUDA baseline of bench/gpu.sh
# and checks gpu_int.h's CUDA/NCCL constants against the real headers. Without
# nvcc it prints one line and builds nothing: the worker never links CUDA
# (gpu_load.c loads it at run time), so everything else builds and tests as usual.
#
# Also usable alone, needing only nvcc (no LuaJIT, libuv, ...), e.g. on a GPU
# machine whose host binaries were built elsewhere:
#   make -f mk/cuda.mk cuda            # cuda_basic.so, cuda_mlp.so and gpu_dispatch
# Settings: NVCC, CUDA_HOME, CUDA_ARCHS (nvcc -gencode list), BUILD.

BUILD ?= build
KDIR ?= $(BUILD)/lib/monarch
NVCC ?= $(shell command -v nvcc 2>/dev/null)
NVCC := $(strip $(NVCC))

ifneq ($(NVCC),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CUDA_INC  := $(CUDA_HOME)/include
# The toolkit's library directory: lib64 in most installs, lib or targets/ in others.
CUDA_LIB  := $(firstword $(wildcard $(CUDA_HOME)/lib64/libcudart.so $(CUDA_HOME)/lib/libcudart.so \
               $(CUDA_HOME)/targets/x86_64-linux/lib/libcudart.so))
CUDA_LIB  := $(patsubst %/,%,$(dir $(CUDA_LIB)))
# Hopper (H100/H200) and Ampere machine code, plus Hopper PTX that newer GPUs JIT-compile.
CUDA_ARCHS ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
              -gencode arch=compute_90,code=compute_90
NVCC_HOST := -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror
NVCC_FLAGS := -O2 -std=c++17 $(CUDA_ARCHS) -Werror all-warnings $(NVCC_HOST) -Ikernels
NVCC_LINK := -cudart shared $(if $(CUDA_LIB),-L$(CUDA_LIB) -Xlinker -rpath=$(CUDA_LIB))

CUDA_TARGETS := $(patsubst kernels/cuda/%.cu,$(KDIR)/%.so,$(wildcard kernels/cuda/*.cu)) \
                $(BUILD)/bench/gpu_dispatch

cuda: $(CUDA_TARGETS)

all: $(CUDA_TARGETS) $(if $(CFLAGS),$(BUILD)/obj/gpu-abi-check.stamp)

# One library per kernels/cuda/*.cu file (cuda_basic, cuda_mlp); the shared cudart is the one gpu_load.c dlopens, so a
# proc holds a single CUDA runtime.
$(KDIR)/%.so: kernels/cuda/%.cu kernels/cpu/mlp_common.h kernels/monarch_kernel.h
	@mkdir -p $(KDIR)
	$(NVCC) $(NVCC_FLAGS) -shared $< -o $@ $(NVCC_LINK) -lcublas

$(BUILD)/bench/gpu_dispatch: bench/gpu_dispatch.cu
	@mkdir -p $(BUILD)/bench
	$(NVCC) $(NVCC_FLAGS) $< -o $@ $(NVCC_LINK) -ldl

# gpu_int.h declares the CUDA and NCCL constants the GPU module needs instead of
# including their headers (the worker builds without CUDA); here they meet the
# headers, in each file of the module.
GPU_SRC := host/proc/gpu.c host/proc/gpu_load.c host/proc/gpu_comm.c
$(BUILD)/obj/gpu-abi-check.stamp: $(GPU_SRC) host/proc/gpu.h host/proc/gpu_int.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DMN_GPU_ABI_CHECK -I$(CUDA_INC) -fsyntax-only $(GPU_SRC)
	@touch $@
else
cuda:
	@echo "CUDA toolkit not found: skipping GPU kernels"

all: cuda
endif

# Not CUDA at all: a fake CUDA runtime and NCCL on host memory (the fake of
# tests/c/fake_gpu.h that test_gpu.c uses, built as a library by fake_gpu.c)
# that gpu_spec.lua gives to procs of its own, so the GPU built-ins and
# monarch.gpu are tested on every machine.
ifdef CFLAGS_BASE
$(BUILD)/tests/libmonarch_fakegpu.so: tests/c/fake_gpu.c tests/c/fake_gpu.h host/proc/gpu.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -fvisibility=hidden -shared -Ihost/proc $< -o $@

tests: $(BUILD)/tests/libmonarch_fakegpu.so
endif

.PHONY: cuda
