# tunegraph: `make` builds build/libtunegraph.a and build/tunegraph; `make test` runs the
# CPU test suite. GPU targets arrive with the CUDA executor.
CC ?= gcc
CFLAGS ?= -O2 -g
CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation -Iinclude -I. -pthread \
          -DTG_PRESETS_DIR='"$(CURDIR)/models/presets"'
LDLIBS = -ljansson -lzstd -lxxhash -lm -lpthread

BUILD := build
LIB_SRC := $(wildcard compiler/*.c runtime/*.c models/*.c datasets/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/*.c)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)
HEADERS := $(wildcard include/tunegraph.h include/tunegraph/*.h compiler/*.h runtime/*.h models/*.h datasets/*.h kernels/*.h tests/*.h)

.PHONY: all test clean
all: $(BUILD)/libtunegraph.a $(BUILD)/tunegraph

$(BUILD)/%.o: %.c $(HEADERS)
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

clean:
	rm -rf $(BUILD)
