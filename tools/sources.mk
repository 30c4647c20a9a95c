# Which csrc/ sources form the common library and which the per-torch glue (read by the
# Makefile and tests/cpp/build.mk). A source in a torch-facing folder, or one that includes a
# torch or Python header itself (runtime/jaxlib_runtime.cpp), is glue: compiled once per torch
# minor and Python. Every other source is the common library, compiled once: a new file that
# includes neither lands there by itself. A torch/Python include in a common source that this
# scan misses still fails loudly: the common library is linked with -z defs.
TORCH_FACING_FOLDERS := device distributed python
TORCH_OR_PYTHON_INCLUDE := ^[[:space:]]*\#[[:space:]]*include[[:space:]]*<(ATen|c10|torch|caffe2|pybind11|Python\.h|frameobject\.h|numpy)\b

ALL_SOURCES  := $(shell find csrc -name '*.cpp' | sort)
GLUE_SOURCES := $(sort $(filter $(TORCH_FACING_FOLDERS:%=csrc/%/%),$(ALL_SOURCES)) \
                  $(shell grep -lE '$(TORCH_OR_PYTHON_INCLUDE)' $(ALL_SOURCES)))
CORE_SOURCES := $(filter-out $(GLUE_SOURCES),$(ALL_SOURCES))
