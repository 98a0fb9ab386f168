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

.PHONY: all test clean gpu gpu-test demo deps
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

# It compiles the CLI's source in, to test its metrics helpers.
$(BUILD)/tests/test_cli_metrics.o: cli/main.c

$(BUILD)/run_tests: $(TEST_OBJ) $(BUILD)/libtunegraph.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# TESTS=substring runs only the tests whose name contains it. The layering rules are
# checked first (scripts/check_layers.sh), with the check's own test.
test: $(BUILD)/run_tests $(BUILD)/tunegraph
	./scripts/check_layers.sh
	./tests/test_check_layers.sh
	./$(BUILD)/run_tests $(TESTS)

# The demo fine-tuning job: on the GPU when there is one, else on the CPU reference.
demo: all
	./scripts/demo.sh

clean:
	rm -rf $(BUILD)

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
