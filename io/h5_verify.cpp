#include "io/h5_verify.h"

#include <hdf5.h>

#include <vector>

#include "core/error.h"
#include "io/h5_check.h"

namespace rlhf::io {

namespace {

struct Visit {
  std::vector<std::string> datasets;
};

herr_t collect(hid_t, const char* name, const H5O_info_t* info, void* data) {
  if (info->type == H5O_TYPE_DATASET) static_cast<Visit*>(data)->datasets.emplace_back(name);
  return 0;
}

// Reads dataset `name` in row blocks of at most ~64 MiB, so a large tensor needs no full copy.
int64_t read_all(hid_t file, const std::string& name, const std::string& path) {
  H5Id d(H5_CHECK(H5Dopen2(file, name.c_str(), H5P_DEFAULT)));
  H5Id type(H5_CHECK(H5Dget_type(d)));
  H5Id space(H5_CHECK(H5Dget_space(d)));
  const int rank = H5_CHECK(H5Sget_simple_extent_ndims(space));
  std::vector<hsize_t> dims(size_t(std::max(rank, 1)), 1);
  if (rank > 0) H5_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
  const size_t elem = H5Tget_size(type);
  RLHF_CHECK(elem > 0, "{}: dataset {} has an element size of 0", path, name);
  if (rank == 0 || H5Tis_variable_str(type) > 0 || H5Tget_class(type) == H5T_VLEN) {
    // Scalars and variable-length data: one read of the whole dataset (small).
    const hssize_t n = H5Sget_simple_extent_npoints(space);
    std::vector<char> buf(size_t(std::max<hssize_t>(n, 1)) * std::max<size_t>(elem, 16));
    if (H5Tis_variable_str(type) > 0 || H5Tget_class(type) == H5T_VLEN) {
      std::vector<char*> strs(size_t(std::max<hssize_t>(n, 1)), nullptr);
      RLHF_CHECK(H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, strs.data()) >= 0,
                 "{}: dataset {} cannot be read: {}", path, name, h5_error_stack());
      H5Dvlen_reclaim(type, space, H5P_DEFAULT, strs.data());
    } else {
      RLHF_CHECK(H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0,
                 "{}: dataset {} cannot be read: {}", path, name, h5_error_stack());
    }
    return int64_t(n) * int64_t(elem);
  }
  hsize_t row = elem;
  for (int i = 1; i < rank; ++i) row *= dims[size_t(i)];
  const hsize_t rows_per = std::max<hsize_t>(1, (hsize_t(64) << 20) / std::max<hsize_t>(row, 1));
  std::vector<char> buf(size_t(std::min(rows_per, dims[0]) * row));
  int64_t bytes = 0;
  for (hsize_t r0 = 0; r0 < dims[0]; r0 += rows_per) {
    std::vector<hsize_t> start(size_t(rank), 0), count(dims);
    start[0] = r0;
    count[0] = std::min(rows_per, dims[0] - r0);
    H5Id fs(H5_CHECK(H5Dget_space(d)));
    H5_CHECK(H5Sselect_hyperslab(fs, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr));
    H5Id ms(H5_CHECK(H5Screate_simple(rank, count.data(), nullptr)));
    RLHF_CHECK(H5Dread(d, type, ms, fs, H5P_DEFAULT, buf.data()) >= 0,
               "{}: dataset {} cannot be read (rows {}..{}): {}", path, name, r0, r0 + count[0] - 1,
               h5_error_stack());
    bytes += int64_t(count[0] * row);
  }
  return bytes;
}

}  // namespace

int64_t verify_hdf5_file(const std::string& path) {
  h5_init();
  // The same access properties as CheckpointReader (no file locking: a reader of the same file
  // may be open in this process, and HDF5 refuses mismatched locking flags).
  H5Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  H5_CHECK(H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG));
  H5_CHECK(H5Pset_file_locking(fapl, false, true));
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  RLHF_CHECK(f >= 0, "{}: cannot open as HDF5: {}", path, h5_error_stack());
  H5Id file(f);
  Visit v;
  RLHF_CHECK(H5Ovisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, collect, &v) >= 0,
             "{}: cannot walk the file's objects: {}", path, h5_error_stack());
  int64_t bytes = 0;
  for (const std::string& name : v.datasets) bytes += read_all(file, name, path);
  return bytes;
}

}  // namespace rlhf::io
