// H5_CHECK: the HDF5 (C API, 1.10) call check, built on RLHF_CHECK_GEN (core/error.h), plus a small
// RAII owner for HDF5 identifiers.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>

#include "core/error.h"

namespace rlhf::io {

/// Turns off HDF5's automatic error printing (H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr)) for the
/// calling thread, once; our checks fetch the error stack themselves. H5_CHECK calls it before
/// every checked call (cost: one thread_local flag test), so nothing else needs to.
void h5_init();

/// The calling thread's HDF5 error stack as one line, from the API call to the innermost cause
/// (deep stacks keep the first and the last two entries), then the innermost minor message:
/// "H5Fopen: unable to open file <- H5F_open: unable to read superblock <- H5F__super_read: file
/// signature not found (Not an HDF5 file)". Clears the stack. "" when the stack is empty.
std::string h5_error_stack();

namespace detail {
/// HDF5 signals failure with a negative hid_t / herr_t / htri_t / ssize_t.
template <typename T>
bool h5_ok(T result) {
  return result >= 0;
}
/// "returned <r>: <error stack>" (the text RLHF_CHECK_GEN puts into the exception).
std::string h5_error_text(int64_t result);
}  // namespace detail

/// Owns one HDF5 identifier (file, group, dataset, dataspace, datatype, attribute, property list)
/// and closes it with the matching H5?close on destruction. Move-only. Close errors in the
/// destructor are swallowed (the destructor may run while an exception unwinds).
class H5Id {
 public:
  H5Id() = default;
  explicit H5Id(hid_t id) : id_(id) {}
  H5Id(H5Id&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  ~H5Id() { reset(); }

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: passes straight into the C API
  bool valid() const { return id_ >= 0; }
  /// Closes the identifier now (no-op when invalid); errors are swallowed.
  void reset() noexcept;
  /// Closes the identifier now and throws rlhf::Error (H5_CHECK) if HDF5 reports a failure, e.g.
  /// when closing a file flushes data that cannot be written.
  void close();

 private:
  hid_t id_ = H5I_INVALID_HID;
};

}  // namespace rlhf::io

/// Checks an HDF5 C API call: `hid_t f = H5_CHECK(H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT));`.
/// Evaluates `expr` once and returns its value; a negative result throws rlhf::Error
/// "HDF5 error: returned -1: <HDF5 error stack> in `expr` at file:line (rank R on host H)".
#define H5_CHECK(expr)    \
  (::rlhf::io::h5_init(), \
   RLHF_CHECK_GEN("HDF5", expr, ::rlhf::io::detail::h5_ok, ::rlhf::io::detail::h5_error_text))
