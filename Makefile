# Monarch for Lua. `make` builds into build/ (a prefix laid out like an
# install); `make test`, `make bench`, `make install PREFIX=...`.
PREFIX ?= /usr/local
BUILD  ?= build
CC     ?= gcc
VERSION := $(shell sed -n 's/^\#define MN_VERSION "\(.*\)"/\1/p' host/core/version.h 2>/dev/null)
PKGS   := luajit libuv msgpack libsodium
DEPS_OK := $(shell pkg-config --exists $(PKGS) openblas ncursesw libzmq libcrypto 2>/dev/null && echo yes)
# Compiling targets need the -dev packages; `make deps` installs (as root) or names them.
ifneq ($(DEPS_OK),yes)
ifeq ($(filter deps clean,$(MAKECMDGOALS)),)
ifneq ($(MAKECMDGOALS),run)
ifneq ($(MAKECMDGOALS),test)
$(error missing build dependencies: run `make deps` (or scripts/deps.sh) first)
endif
endif
endif
endif

SAN    ?=
OPT    ?= -O2
WARN   := -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow -Wformat=2
CFLAGS_BASE := -std=gnu11 -g $(OPT) $(WARN) -fPIC -D_GNU_SOURCE $(SAN)
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS))
PKG_LIBS   := $(shell pkg-config --libs $(PKGS))
LDLIBS := $(PKG_LIBS) -lpthread -ldl -lm
EDIT_LIBS := $(shell pkg-config --libs libedit 2>/dev/null)
CURSES_LIBS := $(shell pkg-config --libs ncursesw) # the screen of monarch-run --top (host/cli/term_lua.c)
ZMQ_LIBS := $(shell pkg-config --libs libzmq libcrypto) # the Jupyter kernel's sockets and signatures (host/cli/jupyter_lua.c)

# Layers (docs/architecture.md): cli -> controller | agent | proc -> coll -> core.
# Each layer's objects see only its own headers and those below it, so an
# include that points the wrong way fails to compile.
INC_core       := -Ihost/core -Ikernels # the kernel ABI header is the floor every layer stands on
INC_coll       := -Ihost/coll $(INC_core)
INC_proc       := -Ihost/proc $(INC_coll)
INC_agent      := -Ihost/agent $(INC_core)
INC_controller := -Ihost/controller $(INC_core)
INC_cli        := -Ihost/controller -Ihost/agent -Ihost/proc $(INC_coll)
INC    := $(INC_cli) # tests, benchmarks and fuzzers see every layer
layer_inc = $(INC_$(word 2,$(subst /, ,$(1))))
CFLAGS := $(CFLAGS_BASE) $(INC) $(PKG_CFLAGS)

CORE_SRC := $(wildcard host/core/*.c)
COLL_SRC := $(wildcard host/coll/*.c)
CTL_SRC  := $(wildcard host/controller/*.c)
WRK_SRC  := $(wildcard host/agent/*.c) $(wildcard host/proc/*.c) $(COLL_SRC)
OBJ = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

BIN    := $(BUILD)/bin
KDIR   := $(BUILD)/lib/monarch
LUAMOD := $(BUILD)/lib/monarch/lua/monarch/core.so
KERNELS := $(KDIR)/basic.so $(KDIR)/faulty.so $(KDIR)/mlp.so $(KDIR)/cartpole.so $(KDIR)/kcoll.so $(KDIR)/shard.so \
           $(KDIR)/gpt.so

NVCC ?= $(shell command -v nvcc 2>/dev/null)

all: $(BIN)/monarch-run $(BIN)/monarch-worker $(LUAMOD) $(KERNELS) $(BUILD)/share/monarch/lua $(BUILD)/share/monarch/jupyter \
     $(BUILD)/share/monarch/ray

# Objects of host/<layer>/ get only that layer's include paths; the rest (tests, benchmarks) get all.
$(BUILD)/obj/host/%.o: host/%.c $(wildcard host/*/*.h) kernels/monarch_kernel.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(call layer_inc,$<) $(PKG_CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.c $(wildcard host/*/*.h) kernels/monarch_kernel.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BIN)/monarch-worker: $(call OBJ,host/cli/monarch-worker.c $(WRK_SRC) $(CORE_SRC))
	@mkdir -p $(BIN)
	$(CC) $(SAN) $^ -o $@ $(LDLIBS) -rdynamic

$(BIN)/monarch-run: $(call OBJ,host/cli/monarch-run.c host/cli/term_lua.c host/cli/jupyter_lua.c $(CTL_SRC) $(CORE_SRC))
	@mkdir -p $(BIN)
	$(CC) $(SAN) $^ -o $@ $(LDLIBS) $(EDIT_LIBS) $(CURSES_LIBS) $(ZMQ_LIBS) -rdynamic

# The same controller core as a Lua C module, so plain luajit (and busted) can drive a cluster.
$(LUAMOD): $(call OBJ,$(CTL_SRC) $(CORE_SRC))
	@mkdir -p $(dir $@)
	$(CC) $(SAN) -shared $^ -o $@ $(filter-out -lluajit-5.1,$(LDLIBS))

$(KDIR)/basic.so: kernels/cpu/basic.c kernels/monarch_kernel.h
	@mkdir -p $(KDIR)
	$(CC) $(CFLAGS_BASE) -fvisibility=hidden -shared -Ikernels $< $(shell pkg-config --cflags --libs openblas) -lm -o $@

$(KDIR)/mlp.so: kernels/cpu/mlp.c kernels/cpu/mlp_common.h kernels/monarch_kernel.h
	@mkdir -p $(KDIR)
	$(CC) $(CFLAGS_BASE) -fvisibility=hidden -shared -Ikernels $< $(shell pkg-config --cflags --libs openblas zlib) -lm -o $@

# The GPT library (examples/gpt.lua): one file per layer or idea, one .so.
GPT_SRC := $(wildcard kernels/cpu/gpt_*.c)
$(KDIR)/gpt.so: $(GPT_SRC) kernels/cpu/gpt.h kernels/cpu/mlp_common.h kernels/monarch_kernel.h
	@mkdir -p $(KDIR)
	$(CC) $(CFLAGS_BASE) -O3 -fvisibility=hidden -shared -Ikernels $(GPT_SRC) $(shell pkg-config --cflags --libs openblas) -lm -o $@

$(KDIR)/shard.so: kernels/cpu/shard.c kernels/monarch_kernel.h
	@mkdir -p $(KDIR)
	$(CC) $(CFLAGS_BASE) -fvisibility=hidden -shared -Ikernels $< $(shell pkg-config --cflags --libs zlib) -o $@

$(KDIR)/cartpole.so: kernels/cpu/cartpole.c kernels/monarch_kernel.h
	@mkdir -p $(KDIR)
	$(CC) $(CFLAGS_BASE) -fvisibility=hidden -shared -Ikernels $< -lm -o $@

$(KDIR)/kcoll.so: kernels/cpu/kcoll.c kernels/monarch_kernel.h
	@mkdir -p $(KDIR)
	$(CC) $(CFLAGS_BASE) -fvisibility=hidden -shared -Ikernels $< -o $@

$(KDIR)/%.so: kernels/test/%.c kernels/monarch_kernel.h
	@mkdir -p $(KDIR)
	$(CC) $(CFLAGS_BASE) -fvisibility=hidden -shared -Ikernels $< -o $@

$(BUILD)/share/monarch/lua:
	@mkdir -p $(BUILD)/share/monarch
	ln -sfn ../../../lua $@

$(BUILD)/share/monarch/jupyter:
	@mkdir -p $(BUILD)/share/monarch
	ln -sfn ../../../deploy/jupyter $@

# The Ray launcher (monarch-run --ray), where the controller looks for it: PREFIX/share/monarch/ray.
$(BUILD)/share/monarch/ray:
	@mkdir -p $(BUILD)/share/monarch
	ln -sfn ../../../deploy/ray $@

# ---- tests ----------------------------------------------------------------
C_TESTS := $(patsubst tests/c/%.c,$(BUILD)/tests/%,$(wildcard tests/c/test_*.c))

$(BUILD)/tests/%: tests/c/%.c $(call OBJ,$(CORE_SRC) $(WRK_SRC))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -O0 $^ -o $@ $(shell pkg-config --cflags --libs cmocka) $(LDLIBS)

# test_shard checks the kernels' CRC-32 against zlib's own.
$(BUILD)/tests/test_shard: LDLIBS += $(shell pkg-config --libs zlib)

# Controller tests (test_ctl_*.c) link the controller's engine, its ctl*.c without the Lua face.
CTL_ENGINE := $(filter host/controller/ctl%,$(CTL_SRC))
$(BUILD)/tests/test_ctl_%: tests/c/test_ctl_%.c $(call OBJ,$(CTL_ENGINE) $(CORE_SRC))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -O0 $^ -o $@ $(shell pkg-config --cflags --libs cmocka) $(LDLIBS)

# The GPT layers' unit tests link the library's sources directly (their internal functions).
$(BUILD)/tests/test_gpt: tests/c/test_gpt.c tests/c/test_gpt_model.h $(GPT_SRC) kernels/cpu/gpt.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -O1 -Ikernels/cpu tests/c/test_gpt.c $(GPT_SRC) -o $@ $(shell pkg-config --cflags --libs cmocka openblas) -lm -lpthread

# A fake NVML that top_spec.lua gives a host agent (MONARCH_NVML): the GPU memory column without a GPU.
$(BUILD)/tests/libmonarch_fakenvml.so: tests/c/fake_nvml.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -fvisibility=hidden -shared $< -o $@

tests: all $(C_TESTS) $(BUILD)/tests/libmonarch_fakenvml.so

# The README's two commands: `make run` (main job) and `make test`.
run: deps
	@$(MAKE) --no-print-directory all
	$(BIN)/monarch-run examples/train.lua

test: deps
	@scripts/deps.sh --tests
	@$(MAKE) --no-print-directory tests
	@tests/run.sh

deps:
	@scripts/deps.sh

# The RL example: CartPole-v0 with Lua env actors; prints episodes and wall time to solve.
rl: all
	$(BIN)/monarch-run examples/rl/run.lua

test-asan:
	$(MAKE) BUILD=build-asan SAN="-fsanitize=address,undefined -fno-omit-frame-pointer" OPT=-O1 test

# tests/valgrind.supp: the dynamic loader's own noise when a test loads the CUDA libraries (test_gpt_cuda).
valgrind: tests
	@for t in $(C_TESTS); do valgrind -q --error-exitcode=1 --leak-check=full --suppressions=tests/valgrind.supp $$t \
	  >/dev/null || exit 1; done; echo "valgrind: clean"

bench: all $(BUILD)/bench/tcp_pingpong $(BUILD)/bench/tcp_stream
	@bench/run.sh

$(BUILD)/bench/%: bench/%.c $(call OBJ,$(CORE_SRC))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/monarch/lua/monarch $(DESTDIR)$(PREFIX)/share/monarch/lua/monarch/proc $(DESTDIR)$(PREFIX)/include
	install -m 755 $(BIN)/monarch-run $(BIN)/monarch-worker $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(KDIR)/basic.so $(KDIR)/mlp.so $(KDIR)/cartpole.so $(KDIR)/kcoll.so $(KDIR)/shard.so $(KDIR)/gpt.so \
	  $(DESTDIR)$(PREFIX)/lib/monarch/
	for f in $(KDIR)/cuda_*.so; do [ ! -e "$$f" ] || install -m 644 "$$f" $(DESTDIR)$(PREFIX)/lib/monarch/; done
	install -m 644 $(LUAMOD) $(DESTDIR)$(PREFIX)/lib/monarch/lua/monarch/
	install -m 644 lua/monarch/*.lua $(DESTDIR)$(PREFIX)/share/monarch/lua/monarch/
	install -m 644 lua/monarch/proc/*.lua $(DESTDIR)$(PREFIX)/share/monarch/lua/monarch/proc/
	install -m 644 kernels/monarch_kernel.h $(DESTDIR)$(PREFIX)/include/
	install -d $(DESTDIR)$(PREFIX)/share/monarch/ray
	install -m 644 deploy/ray/monarch_ray.py $(DESTDIR)$(PREFIX)/share/monarch/ray/
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' mk/monarch-kernel.pc.in \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/monarch-kernel.pc
	install -d $(DESTDIR)$(PREFIX)/share/monarch/jupyter
	install -m 644 deploy/jupyter/*.png $(DESTDIR)$(PREFIX)/share/monarch/jupyter/
	# The kernelspec, where Jupyter looks (PREFIX/share/jupyter/kernels), when Jupyter is installed.
	if command -v jupyter >/dev/null 2>&1; then \
	  $(DESTDIR)$(PREFIX)/bin/monarch-run --install-kernel --prefix $(DESTDIR)$(PREFIX); fi

clean:
	rm -rf build build-asan

.PHONY: all run rl deps tests test test-asan valgrind bench install clean
.SECONDARY:
-include mk/cuda.mk
-include mk/fuzz.mk

# `make print-VAR` prints a variable (tests/layers.sh reads the layers' include paths).
print-%:
	@echo '$($*)'
