# torchtpu: `make demo` and `make test` do all setup on a fresh machine; `make build` recompiles.
# The C++ core is compiled by the rules below and nowhere else: `pip install .`, `pip wheel .`,
# `python -m build` and `pip install -e .` reach them through setup.py (target `extension`).
PYTHON_BOOT ?= python3.11
VENV        := .venv
PY          := $(VENV)/bin/python
DEPS_STAMP  := $(VENV)/.torchtpu-deps
EDIT_STAMP  := $(VENV)/.torchtpu-editable
CCACHE      := $(shell command -v ccache 2>/dev/null)
CXX         ?= g++
JOBS        ?= $(shell nproc)
OPT         ?= -O2
# Where objects, flags (config.mk) and the linked library go; one per torch build.
BUILD_DIR   ?= build
# Where the linked _C and _build_info.py are copied: the package in the source tree, or
# setuptools' staging folder when pip builds a wheel.
PACKAGE_DIR ?= torchtpu
# _C finds libtorch in the torch package beside it (site-packages); in a source checkout
# `import torch` has loaded libtorch before torchtpu loads _C, so the path is never needed.
RPATH       := $$ORIGIN/../torch/lib

SOURCES := $(shell find csrc -name '*.cpp' | sort)
OBJECTS := $(patsubst csrc/%.cpp,$(BUILD_DIR)/obj/%.o,$(SOURCES))

.PHONY: all install build extension compiled-core cpptest demo test bench check-torch211 clean distclean

all: install

$(PY):
	$(PYTHON_BOOT) -m venv $(VENV)

$(DEPS_STAMP): requirements.txt constraints.txt | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -c constraints.txt
	touch $@

# The editable install compiles through setup.py, i.e. `make extension` below.
$(EDIT_STAMP): pyproject.toml setup.py $(DEPS_STAMP)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

build: $(DEPS_STAMP)
	@$(MAKE) --no-print-directory extension PY=$(PY)

# Flags first (cheap when torch is unchanged), then a second make that reads them.
extension:
	@$(PY) tools/build_flags.py $(BUILD_DIR)
	@$(MAKE) --no-print-directory -j$(JOBS) compiled-core

-include $(BUILD_DIR)/config.mk

LIBRARY := $(BUILD_DIR)/_C$(EXT_SUFFIX)

$(BUILD_DIR)/obj/%.o: csrc/%.cpp $(BUILD_DIR)/config.mk
	@mkdir -p $(dir $@)
	@echo "  CXX $<"
	@$(CCACHE) $(CXX) $(OPT) -g0 -Wall -Wno-unused-function -Icsrc $(TORCH_CXXFLAGS) -MMD -MP -c $< -o $@

$(LIBRARY): $(OBJECTS)
	@echo "  LINK $@"
	@$(CXX) -shared -o $@ $(OBJECTS) $(TORCH_LDFLAGS) '-Wl,-rpath,$(RPATH)'

-include $(OBJECTS:.o=.d)

# Copies by rename, so a process that has the old _C loaded keeps a valid file. _build_info.py
# tells torchtpu/_versions.py, before _C is loaded, which torch _C was compiled against.
compiled-core: $(LIBRARY)
	@mkdir -p $(PACKAGE_DIR)
	@cmp -s $(LIBRARY) $(PACKAGE_DIR)/_C$(EXT_SUFFIX) || \
	  { cp $(LIBRARY) $(PACKAGE_DIR)/.C.tmp && mv -f $(PACKAGE_DIR)/.C.tmp $(PACKAGE_DIR)/_C$(EXT_SUFFIX); }
	@printf '# Written by the build: the torch that torchtpu._C was compiled against.\nTORCH_VERSION = "%s"\n' \
	  '$(TORCH_VERSION)' > $(BUILD_DIR)/_build_info.py
	@cmp -s $(BUILD_DIR)/_build_info.py $(PACKAGE_DIR)/_build_info.py || cp $(BUILD_DIR)/_build_info.py $(PACKAGE_DIR)/

install: $(EDIT_STAMP) build

# The engine and the lowerings built and run without torch (tests/cpp; tests/test_cpp.py
# runs it too, so `make test` covers it).
cpptest:
	@$(MAKE) --no-print-directory -f tests/cpp/build.mk run

demo: install
	$(PY) examples/demo.py

test: install
	$(PY) -m pytest -q tests

bench: install
	$(PY) bench/run.py

# The GPU image's torch 2.11 with the development jax, in a venv and build folder of their own:
# pip installs the package there (--no-build-isolation, so against that venv's torch) and a
# fast subset of the tests runs outside the source tree. Not part of `make test`: the first
# run downloads torch 2.11 (a CUDA build, GBs) and compiles everything once.
T211_DIR   := build/torch211
T211_PY    := $(T211_DIR)/venv/bin/python
T211_TESTS ?= tests/test_smoke.py tests/test_device.py tests/ops/test_shape.py \
  tests/test_packaging.py::test_version_guard_messages \
  tests/test_packaging.py::test_version_guard_raises_before_loading_core \
  tests/test_packaging.py::test_report_exits_nonzero_with_the_fix

$(T211_PY):
	$(PYTHON_BOOT) -m venv $(T211_DIR)/venv

$(T211_DIR)/.deps: tools/constraints-torch211.txt | $(T211_PY)
	$(T211_PY) -m pip install -q --upgrade pip
	$(T211_PY) -m pip install -q torch 'jax[cpu]' jaxlib numpy pytest 'setuptools>=70.1' \
	  -c tools/constraints-torch211.txt
	touch $@

check-torch211: $(T211_DIR)/.deps
	TORCHTPU_BUILD_DIR=$(T211_DIR) $(T211_PY) -m pip install -q --no-deps --no-build-isolation \
	  --force-reinstall .
	cd $(T211_DIR) && venv/bin/python -m pytest -q -p no:cacheprovider $(addprefix $(CURDIR)/,$(T211_TESTS))

clean:
	rm -rf build dist torchtpu/_C*.so torchtpu/_build_info.py

distclean: clean
	rm -rf $(VENV)
