# tunegraph: `make` builds build/libtunegraph.a and build/tunegraph; `make test` runs the
# CPU test suite. `make gpu` builds the CUDA executor into build/gpu/ (tunegraph and
# run_tests); `make gpu-test` runs the whole suite on the GPU (needs one).
CC ?= gcc
CFLAGS ?= -O2 -g
CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation -I. -pthread \
          -DTG_PRESETS_DIR='"$(CURDIR)/models/presets"'
LDLIBS = -ljansson -lzstd -lm -lpthread

BUILD := build
LIB_SRC := $(wildcard base/*.c plan/*.c compiler/*.c runtime/*.c models/*.c datasets/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/*.c)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)
HEADERS := $(wildcard base/*.h plan/*.h compiler/*.h runtime/*.h runtime/cuda/*.h models/*.h datasets/*.h kernels/*.h kernels/*.cuh tests/*.h)

.PHONY: all test clean gpu gpu-test demo deps fuzz-deps test-asan fuzz
all: $(BUILD)/libtunegraph.a $(BUILD)/tunegraph

# Installs missing build packages (Debian/Ubuntu); the objects wait for it.
deps:
	@./scripts/install-deps.sh

$(BUILD)/%.o: %.c $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libtunegraph.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/tunegraph: $(BUILD)/cli/main.o $(BUILD)/libtunegraph.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/run_tests: $(TEST_OBJ) $(BUILD)/libtunegraph.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# TESTS=substring runs only the tests whose name contains it.
test: $(BUILD)/run_tests $(BUILD)/tunegraph
	./$(BUILD)/run_tests $(TESTS)

# The demo fine-tuning job: on the GPU when there is one, else on the CPU reference.
demo: all
	./scripts/demo.sh

clean:
	rm -rf $(BUILD)

# ---- sanitizers -------------------------------------------------------------------------
# The library, CLI and suite again with AddressSanitizer and UBSan (leaks included); the
# first report aborts. The suite runs the CLI it was built with (TG_TEST_CLI).
ASAN := $(BUILD)/asan
ASAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -O1 -g
ASAN_LIB_OBJ := $(LIB_SRC:%.c=$(ASAN)/%.o)
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

$(ASAN)/%.o: %.c $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ASAN_FLAGS) -c $< -o $@

$(ASAN)/libtunegraph.a: $(ASAN_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(ASAN)/tunegraph: $(ASAN)/cli/main.o $(ASAN)/libtunegraph.a
	$(CC) $(CFLAGS) $(ASAN_FLAGS) $^ -o $@ $(LDLIBS)

$(ASAN)/run_tests: $(TEST_SRC:%.c=$(ASAN)/%.o) $(ASAN)/libtunegraph.a
	$(CC) $(CFLAGS) $(ASAN_FLAGS) $^ -o $@ $(LDLIBS)

test-asan: $(ASAN)/run_tests $(ASAN)/tunegraph
	$(ASAN_ENV) TG_TEST_CLI=./$(ASAN)/tunegraph ./$(ASAN)/run_tests $(TESTS)

# ---- fuzzing ----------------------------------------------------------------------------
# One libFuzzer target per parser (tests/fuzz/fuzz_*.c), built with clang into build/fuzz/
# with ASan and UBSan. `make fuzz` runs each for FUZZ_SECONDS from a fresh copy of its seed
# corpus and fails on any crash, leak or sanitizer report. Plan seeds are compiled from
# examples/*.job here rather than committed, so they follow the plan format version.
CLANG ?= clang
FUZZ := $(BUILD)/fuzz
FUZZ_SECONDS ?= 30
FUZZ_TARGETS := job plan model_config safetensors dataset
FUZZ_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -O1 -g \
              -Wno-unknown-warning-option
# The parsers and what they link: the layers below the compiler, and the job reader.
FUZZ_LIB_SRC := $(wildcard base/*.c plan/*.c models/*.c datasets/*.c) compiler/job.c
FUZZ_LIB_OBJ := $(FUZZ_LIB_SRC:%.c=$(FUZZ)/obj/%.o)
.SECONDARY: $(FUZZ_LIB_OBJ)

# clang and its libFuzzer runtime, installed when missing (scripts/install-deps.sh).
fuzz-deps: deps
	@./scripts/install-deps.sh fuzz

$(FUZZ)/obj/%.o: %.c $(HEADERS) | deps fuzz-deps
	@mkdir -p $(dir $@)
	$(CLANG) $(CFLAGS) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_input.h $(FUZZ_LIB_OBJ) | fuzz-deps
	$(CLANG) $(CFLAGS) $(FUZZ_FLAGS) -fsanitize=fuzzer $< $(FUZZ_LIB_OBJ) -o $@ $(LDLIBS)

# Plan seeds: the example jobs as they are and with a few keys varied.
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

fuzz: $(FUZZ_TARGETS:%=$(FUZZ)/fuzz_%) $(FUZZ)/corpus/plan
	./tests/fuzz/run.sh $(FUZZ) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# ---- CUDA executor ----------------------------------------------------------------------
NVCC ?= nvcc
CUDA_HOME ?= /usr/local/cuda
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90
NVCCFLAGS ?= -O3
NVCCFLAGS += $(CUDA_ARCH) -std=c++17 -I. -Xcompiler -Wall
GPU := $(BUILD)/gpu
CU_OBJ := $(patsubst %.cu,$(GPU)/%.o,$(wildcard kernels/*.cu))
CUDA_HOST_OBJ := $(patsubst %.c,$(GPU)/%.o,$(wildcard runtime/cuda/*.c))
GPU_TEST_OBJ := $(patsubst %.c,$(GPU)/%.o,$(wildcard tests/gpu/*.c))
# Objects, not an archive: the CUDA constructor resolves a weak reference in the library.
GPU_OBJ := $(CU_OBJ) $(CUDA_HOST_OBJ)
GPU_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lnccl -lcudart_static -ldl -lrt -lstdc++

$(GPU)/kernels/%.o: kernels/%.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(GPU)/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include -c $< -o $@

$(GPU)/tunegraph: $(BUILD)/cli/main.o $(GPU_OBJ) $(BUILD)/libtunegraph.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(GPU_LDLIBS)

$(GPU)/run_tests: $(TEST_OBJ) $(GPU_TEST_OBJ) $(GPU_OBJ) $(BUILD)/libtunegraph.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(GPU_LDLIBS)

# The CUDA driver's event thread's CPU in an idle process (bench/driver_thread_cpu.c).
$(GPU)/driver_thread_cpu: bench/driver_thread_cpu.c $(BUILD)/libtunegraph.a
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include $^ -o $@ $(LDLIBS) $(GPU_LDLIBS)

gpu: $(GPU)/tunegraph $(GPU)/run_tests $(GPU)/driver_thread_cpu

# The whole suite with the CUDA executor (TG_TEST_DEVICE=cuda), plus the device tests.
gpu-test: gpu $(BUILD)/tunegraph
	TG_TEST_DEVICE=cuda ./$(GPU)/run_tests $(TESTS)
