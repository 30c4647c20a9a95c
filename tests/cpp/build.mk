# Builds and runs tests/cpp: the engine and the lowerings without torch or Python (the
# layers below the device layer include neither). Used by `make cpptest` and by
# tests/test_cpp.py; it reads no torch build flags, so it needs no virtual environment.
#   make -f tests/cpp/build.mk run
CCACHE      := $(shell command -v ccache 2>/dev/null)
JOBS        ?= $(shell nproc)
CPPTEST_OPT ?= -O0

# The common library's sources (tools/sources.mk: every csrc file without torch or Python).
include tools/sources.mk
SOURCES := $(CORE_SOURCES) $(wildcard tests/cpp/*.cpp)
OBJECTS := $(patsubst %.cpp,build/cpptest/%.o,$(SOURCES))
BINARY  := build/cpptest/engine_test

.PHONY: run binary
run: binary
	./$(BINARY)

binary:
	@$(MAKE) --no-print-directory -f tests/cpp/build.mk -j$(JOBS) $(BINARY)

build/cpptest/%.o: %.cpp
	@mkdir -p $(dir $@)
	@echo "  CXX $<"
	@$(CCACHE) $(CXX) -std=c++20 $(CPPTEST_OPT) -g0 -Wall -Wno-unused-function -Icsrc -MMD -MP -c $< -o $@

$(BINARY): $(OBJECTS)
	@echo "  LINK $@"
	@$(CXX) -o $@ $(OBJECTS) -ldl -pthread

-include $(OBJECTS:.o=.d)
