// The one piece of the binding that knows Python: a workspace the host could not allocate
// reaches Python as MemoryError, with the size asked. torch maps its own out-of-memory error to
// torch.OutOfMemoryError, a RuntimeError; torch's error handlers (torch/csrc/Exceptions.h) raise
// a PyTorchError's python_type() instead, wherever the operator was called from, the autograd
// engine's backward included.
#include <Python.h>
#include <torch/csrc/Exceptions.h>

#include <string>

#include "errors.h"

namespace attn2d {
namespace binding {
namespace {

struct WorkspaceMemoryError : torch::PyTorchError {
  using torch::PyTorchError::PyTorchError;
  PyObject* python_type() override { return PyExc_MemoryError; }
};

}  // namespace

void throw_memory_error(const std::string& message) { throw WorkspaceMemoryError(message); }

}  // namespace binding
}  // namespace attn2d
