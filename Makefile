# torchtpu: `make demo` and `make test` do all setup on a fresh machine.
PYTHON_BOOT ?= python3.11
VENV        := .venv
PY          := $(VENV)/bin/python
DEPS_STAMP  := $(VENV)/.torchtpu-deps
EDIT_STAMP  := $(VENV)/.torchtpu-editable
CCACHE      := $(shell command -v ccache 2>/dev/null)
CXX         ?= g++
JOBS        ?= $(shell nproc)
OPT         ?= -O2

SOURCES := $(shell find csrc -name '*.cpp' | sort)
OBJECTS := $(patsubst csrc/%.cpp,build/obj/%.o,$(SOURCES))

.PHONY: all install build demo test bench clean distclean

all: install

$(PY):
	$(PYTHON_BOOT) -m venv $(VENV)

$(DEPS_STAMP): requirements.txt constraints.txt | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -c constraints.txt
	touch $@

$(EDIT_STAMP): pyproject.toml $(DEPS_STAMP)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

build/config.mk: tools/build_flags.py $(DEPS_STAMP)
	$(PY) tools/build_flags.py $@

-include build/config.mk

EXTENSION := torchtpu/_C$(EXT_SUFFIX)

build/obj/%.o: csrc/%.cpp build/config.mk
	@mkdir -p $(dir $@)
	@echo "  CXX $<"
	@$(CCACHE) $(CXX) $(OPT) -g0 -Wall -Wno-unused-function -Icsrc $(TORCH_CXXFLAGS) -MMD -MP -c $< -o $@

$(EXTENSION): $(OBJECTS)
	@echo "  LINK $@"
	@$(CXX) -shared -o $@ $(OBJECTS) $(TORCH_LDFLAGS)

-include $(OBJECTS:.o=.d)

build: build/config.mk
	@$(MAKE) --no-print-directory -j$(JOBS) $(EXTENSION)

install: $(EDIT_STAMP) build

demo: install
	$(PY) examples/demo.py

test: install
	$(PY) -m pytest -q tests

bench: install
	$(PY) bench/run.py

clean:
	rm -rf build torchtpu/_C*.so

distclean: clean
	rm -rf $(VENV)
