# mk/cuda.mk - CUDA kernels and GPU benchmarks, built only where nvcc is.
#
# Included at the end of the Makefile (`-include mk/cuda.mk`): when the CUDA
# toolkit is found, `make` (target all) also builds
#   $(KDIR)/cuda_basic.so       the "cuda_basic" kernel library
#   $(KDIR)/cuda_mlp.so         the "cuda_mlp" kernel library (examples/train.lua on GPUs)
#   $(KDIR)/cuda_gpt.so         the "cuda_gpt" kernel library (examples/gpt.lua on GPUs), from
#                               kernels/cuda/gpt_*.cu and the host-only gpt_model.c, gpt_data.c,
#                               gpt_adamw.c of kernels/cpu (the same layout, weights and batches)
#   $(BUILD)/tests/gpt_cuda_check  each cuda_gpt layer against gpt's on the same inputs (GPU only)
#   $(BUILD)/bench/gpu_dispatch the bare-CUDA baseline of bench/gpu.sh
# and checks gpu_int.h's CUDA/NCCL constants against the real headers. Without
# nvcc it prints one line and builds nothing: the worker never links CUDA
# (gpu_load.c loads it at run time), so everything else builds and tests as usual.
#
# Also usable alone, needing only nvcc (no LuaJIT, libuv, ...), e.g. on a GPU
# machine whose host binaries were built elsewhere:
#   make -f mk/cuda.mk cuda            # cuda_basic.so, cuda_mlp.so, cuda_gpt.so, gpu_dispatch, gpt_cuda_check
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

CUDA_TARGETS := $(patsubst kernels/cuda/%.cu,$(KDIR)/%.so,$(wildcard kernels/cuda/cuda_*.cu)) \
                $(KDIR)/cuda_gpt.so $(BUILD)/bench/gpu_dispatch
# gpt's C layers, which the check of cuda_gpt links, need OpenBLAS: without its pkg-config entry no check.
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS := $(shell pkg-config --libs openblas 2>/dev/null)
CUDA_TARGETS += $(if $(BLAS_LIBS),$(BUILD)/tests/gpt_cuda_check)

cuda: $(CUDA_TARGETS)

all: $(CUDA_TARGETS) $(if $(CFLAGS),$(BUILD)/obj/gpu-abi-check.stamp)

# One library per kernels/cuda/cuda_*.cu file (cuda_basic, cuda_mlp); the shared cudart is the one gpu_load.c dlopens, so a
# proc holds a single CUDA runtime.
$(KDIR)/%.so: kernels/cuda/%.cu kernels/cpu/mlp_common.h kernels/monarch_kernel.h
	@mkdir -p $(KDIR)
	$(NVCC) $(NVCC_FLAGS) -shared $< -o $@ $(NVCC_LINK) -lcublas

# cuda_gpt: one object per kernels/cuda/gpt_*.cu (one file per layer, as kernels/cpu/gpt_*.c), plus the CPU
# library's host-only files compiled by the C compiler: the layout, initial weights, batches and schedule are
# theirs, not a copy. OpenBLAS is not needed (those files make no matrix product).
GPT_CU := $(wildcard kernels/cuda/gpt_*.cu)
GPT_HOST := kernels/cpu/gpt_model.c kernels/cpu/gpt_data.c kernels/cpu/gpt_adamw.c
GPT_CU_OBJ := $(patsubst kernels/cuda/%.cu,$(BUILD)/obj/cuda/%.o,$(GPT_CU))
GPT_HOST_OBJ := $(patsubst kernels/cpu/%.c,$(BUILD)/obj/cuda/cpu_%.o,$(GPT_HOST))
GPT_HDR := kernels/cuda/gpt_cuda.h kernels/cpu/gpt.h kernels/cpu/mlp_common.h kernels/monarch_kernel.h
GPT_HOST_CFLAGS ?= -std=gnu11 -O2 -fPIC -fvisibility=hidden -Wall -Wextra -Werror -Wno-unused-parameter -D_GNU_SOURCE

$(BUILD)/obj/cuda/%.o: kernels/cuda/%.cu $(GPT_HDR)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(BUILD)/obj/cuda/cpu_%.o: kernels/cpu/%.c $(GPT_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(GPT_HOST_CFLAGS) -Ikernels $(BLAS_CFLAGS) -c $< -o $@

$(KDIR)/cuda_gpt.so: $(GPT_CU_OBJ) $(GPT_HOST_OBJ)
	@mkdir -p $(KDIR)
	$(NVCC) $(CUDA_ARCHS) -shared $^ -o $@ $(NVCC_LINK) -lcublas -lm

# The layer check of bench/gpu_check.sh: cuda_gpt's layers (all but the table) against gpt's C layers, which
# need OpenBLAS; without its pkg-config entry the check is not built (gpu_check.sh says so).
# The check links all of gpt's C files and all of cuda_gpt's but its table (both define monarch_kernels).
GPT_CPU_OBJ := $(patsubst kernels/cpu/%.c,$(BUILD)/obj/cuda/cpu_%.o,$(wildcard kernels/cpu/gpt_*.c))
GPT_CHECK_OBJ := $(filter-out %/gpt_kernels.o,$(GPT_CU_OBJ)) $(GPT_CPU_OBJ)
$(BUILD)/tests/gpt_cuda_check: tests/cuda/gpt_cuda_check.cu $(GPT_HDR) $(GPT_CHECK_OBJ)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -Ikernels/cuda $< $(GPT_CHECK_OBJ) -o $@ $(NVCC_LINK) -lcublas $(BLAS_LIBS) -lm

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
