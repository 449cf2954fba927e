# mk/fuzz.mk - libFuzzer targets in tests/fuzz, included by the Makefile.
#   make fuzz-build     builds build-fuzz/fuzz/fuzz_{frame,handshake,join,exec} with clang
#   make fuzz           builds, then runs each for FUZZ_SECONDS (tests/fuzz/run.sh)
#   make fuzz-corpus    regenerates the seed corpora (tests/fuzz/gen_corpus.lua)
# The project's own sources are compiled again by clang with the project's
# warning flags plus the sanitizers and coverage, into $(FUZZ_BUILD)/obj.
FUZZ_BUILD   ?= build-fuzz
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 30
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
# -Wno-format-nonliteral: clang's -Wformat=2 also flags vsnprintf(fmt) in a
# varargs function that lacks __attribute__((format)) (exec.c api_error); gcc does not.
FUZZ_CFLAGS  := -std=gnu11 -g -O1 $(WARN) -Wno-format-nonliteral -fPIC -D_GNU_SOURCE $(FUZZ_SAN) \
                -fsanitize=fuzzer-no-link $(INC) $(PKG_CFLAGS)
FUZZ_LIBS    := $(shell pkg-config --libs msgpack libsodium 2>/dev/null) -ldl -lpthread -lm
FUZZ_OBJ      = $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,$(1))
FUZZ_BINS    := $(addprefix $(FUZZ_BUILD)/fuzz/,fuzz_frame fuzz_handshake fuzz_join fuzz_exec)

$(FUZZ_BUILD)/obj/%.o: %.c $(wildcard host/*/*.h) kernels/monarch_kernel.h tests/fuzz/fuzz_util.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

$(FUZZ_BUILD)/fuzz/fuzz_frame: $(call FUZZ_OBJ,tests/fuzz/fuzz_frame.c host/core/wire.c host/core/err.c host/core/msg.c host/core/msg_pack.c)
$(FUZZ_BUILD)/fuzz/fuzz_handshake: $(call FUZZ_OBJ,tests/fuzz/fuzz_handshake.c host/core/wire.c host/core/err.c host/core/msg.c host/core/msg_pack.c \
                                   host/core/auth.c host/core/handshake.c)
$(FUZZ_BUILD)/fuzz/fuzz_join: $(call FUZZ_OBJ,tests/fuzz/fuzz_join.c host/core/wire.c host/core/err.c host/core/msg.c host/core/msg_pack.c \
                              host/core/auth.c host/core/join.c)
$(FUZZ_BUILD)/fuzz/fuzz_exec: $(call FUZZ_OBJ,tests/fuzz/fuzz_exec.c host/core/wire.c host/core/err.c host/core/msg.c host/core/msg_pack.c \
                              host/core/dtype.c host/proc/exec.c host/proc/exec_builtins.c host/proc/exec_coll.c host/proc/sig.c \
                              host/proc/scratch.c host/proc/registry.c host/proc/cancel.c host/proc/trace.c \
                              host/core/ship.c)
$(FUZZ_BINS):
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer $^ -o $@ $(FUZZ_LIBS)

# fuzz_exec loads the basic kernel library from $(FUZZ_BUILD) (MONARCH_PREFIX),
# built instrumented too so that argument handling inside kernels is checked.
$(FUZZ_BUILD)/lib/monarch/basic.so: kernels/cpu/basic.c kernels/monarch_kernel.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -std=gnu11 -g -O1 $(WARN) -fPIC -D_GNU_SOURCE $(FUZZ_SAN) -fsanitize=fuzzer-no-link \
	  -fvisibility=hidden -shared -Ikernels $< $(shell pkg-config --cflags --libs openblas) -lm -o $@

fuzz-build: $(FUZZ_BINS) $(FUZZ_BUILD)/lib/monarch/basic.so

fuzz: fuzz-build
	@FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh

fuzz-corpus:
	luajit tests/fuzz/gen_corpus.lua tests/fuzz/corpus

.PHONY: fuzz fuzz-build fuzz-corpus
